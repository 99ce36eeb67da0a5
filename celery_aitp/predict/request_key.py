"""The prediction cache key straight from a task's arguments, without the feature vector.

:meth:`FeatureSpec.vector` builds every feature and :func:`compiled.compile_key` then
bins the ones the model uses; on the publish path that was two calls and a 21-value
tuple per task. This module generates, once per model, one function computing only the
used features (each exactly as ``vector`` does) and binning each in place, so
``request_key(...) == compiled.key(spec.vector(...))`` for every input. A cache miss then
walks the forests over that key (``CompiledRuntimeModel.key_scores``), so the vector is
never built on the publish path. The generated source holds only names, indices and
numbers produced here; vocabularies and thresholds are passed in as objects.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import Any

from celery_aitp.predict.compiled import CompiledRuntimeModel
from celery_aitp.predict.features import (
    _NO_HISTORY,
    BASE_FEATURES,
    BIG,
    HISTORY_FEATURES,
    NAN,
    FeatureSpec,
    _number_or_nan,
    hour_and_weekday,
    value_of,
)

RequestKey = Callable[..., tuple[Any, ...]]
_ARGS = ("task", "tenant", "args", "kwargs", "args_bytes", "kwargs_bytes", "hint_s",
         "retries", "published_at", "history")
_BASE = {name: j for j, name in enumerate(BASE_FEATURES)}


def _raw(j: int, spec: FeatureSpec) -> str:
    """The expression ``FeatureSpec.vector`` evaluates for feature ``j``."""
    name = spec.names[j]
    if j >= len(BASE_FEATURES):
        return _number(f"kwargs.get({spec.kwarg_names[j - len(BASE_FEATURES)]!r})")
    if name.startswith("arg") and name[3:].isdigit():
        i = int(name[3:])
        return f"({_number(f'args[{i}]')} if len(args) > {i} else NAN)"
    return {
        "task": "TASKS.get(task, NAN)",
        "tenant": "TENANTS.get(tenant, NAN)",
        "n_args": "len(args)",
        "n_kwargs": "len(kwargs)",
        "args_bytes": "(args_bytes if type(args_bytes) is int else _nn(args_bytes))",
        "kwargs_bytes": "(kwargs_bytes if type(kwargs_bytes) is int else _nn(kwargs_bytes))",
        "hint_s": "(NAN if hint_s is None else _nn(hint_s))",
        "retries": "(retries if type(retries) is int else NAN)",
        "hour": "hour", "weekday": "weekday",
        **{h: f"hist[{i}]" for h, i in _HISTORY.items()},
    }[name]


_HISTORY = {name: i for i, name in enumerate(HISTORY_FEATURES)}
#: History tuples whose bins are kept before the cache starts over.
HISTORY_CACHE = 4096


def _bin(p: int, j: int, compiled: CompiledRuntimeModel, namespace: dict[str, Any]) -> str:
    """The key's expression for used feature ``j`` (the ``p``-th), from its value ``f<p>``."""
    if j in compiled.categories:
        namespace[f"C{p}"] = compiled.categories[j]
        return f"((f{p} if f{p} in C{p} else -2) if f{p} == f{p} else -1)"
    namespace[f"T{p}"] = compiled.thresholds[j]
    return f"(_bl(T{p}, f{p}) if f{p} == f{p} else -1)"


def _history_binner(parts: list[str], namespace: dict[str, Any]) -> Callable[..., Any]:
    """``hist -> (hist, bins...)``, remembered by identity in ``namespace['HB']``."""
    source = (
        "def _history_bins(hist):\n"
        f"    found = (hist, {', '.join(parts)})\n"
        f"    if len(HB) >= {HISTORY_CACHE}:\n"
        "        HB.clear()\n"
        "    HB[id(hist)] = found\n"
        "    return found\n"
    )
    exec(compile(source, "<celery_aitp compiled history bins>", "exec"), namespace)  # noqa: S102
    return namespace["_history_bins"]


def _number(expression: str) -> str:
    """``value_of(expression)`` with its common cases (a plain int or float; None, as
    a keyword argument this task does not take reads) inlined."""
    return (f"(x if (type(x := {expression}) is int or type(x) is float) "
            f"and -{BIG!r} < x < {BIG!r} else NAN if x is None else _v(x))")


def compile_request_key(spec: FeatureSpec, compiled: CompiledRuntimeModel
                        ) -> RequestKey | None:
    """``f(task, tenant, args, kwargs, args_bytes, kwargs_bytes, hint_s, retries,
    published_at, history)`` returning the model's cache key; None without key forests."""
    if compiled.key_scores is None or len(spec.names) != compiled.n_features:
        return None
    used = compiled.used_features
    names = {spec.names[j] for j in used}
    lines = [f"def request_key({', '.join(_ARGS)}):"]
    if names & {"n_args", "arg0", "arg1", "arg2", "arg3"}:
        lines.append("    if type(args) is not tuple and type(args) is not list:")
        lines.append("        args = ()")
    if "n_kwargs" in names or any(j >= len(BASE_FEATURES) for j in used):
        lines.append("    if not isinstance(kwargs, dict):")
        lines.append("        kwargs = {}")
    if names & {"hour", "weekday"}:
        lines += [
            "    if type(published_at) is float and 0.0 <= published_at < 1e12:",
            "        days, seconds = divmod(int(published_at), 86400)",
            "        hour, weekday = seconds // 3600, (days + 3) % 7",
            "    else:",
            "        hour, weekday = _hw(published_at)",
        ]
    history_used = [j for j in used if spec.names[j] in _HISTORY]
    if history_used:  # bins of the (tenant, task) history, per history tuple (cached)
        lines += [
            "    hist = history or _NOH",
            "    hb = HB.get(id(hist))",
            "    if hb is None or hb[0] is not hist:",
            "        hb = _history_bins(hist)",
        ]
    namespace: dict[str, Any] = {
        "NAN": NAN, "_v": value_of, "_nn": _number_or_nan, "_hw": hour_and_weekday,
        "_NOH": _NO_HISTORY, "_bl": bisect_left, "TASKS": spec.tasks, "TENANTS": spec.tenants,
        "HB": {},
    }
    parts = []
    history_parts = []
    keyword_lines = []  # bins of keyword arguments, each absent one straight to -1
    keyword_bins = []
    for p, j in enumerate(used):
        name = spec.names[j]
        if name in ("task", "tenant") and j in compiled.categories:
            vocabulary = spec.tasks if name == "task" else spec.tenants
            namespace[f"K{p}"] = {
                word: code if code in compiled.categories[j] else -2
                for word, code in vocabulary.items()
            }
            parts.append(f"K{p}.get({name}, -1)")  # an unknown name is missing: -1
            continue
        expression = _bin(p, j, compiled, namespace)
        if name in _HISTORY:
            history_parts.append(f"(lambda f{p}: {expression})(hist[{_HISTORY[name]}])")
            parts.append(f"hb[{len(history_parts)}]")
            continue
        if j >= len(BASE_FEATURES):  # None reads as NaN, whose bin is -1
            keyword = spec.kwarg_names[j - len(BASE_FEATURES)]
            keyword_lines += [
                f"        f{p} = kwargs.get({keyword!r})",
                f"        if f{p} is None:",
                f"            k{p} = -1",
                "        else:",
                f"            f{p} = {_number(f'f{p}')}",
                f"            k{p} = {expression}",
            ]
            keyword_bins.append(f"k{p}")
            parts.append(f"k{p}")
            continue
        lines.append(f"    f{p} = {_raw(j, spec)}")
        parts.append(expression)
    if keyword_bins:  # many tasks take no keyword arguments: all -1 at once
        lines += ["    if kwargs:", *keyword_lines, "    else:",
                  f"        {' = '.join(keyword_bins)} = -1"]
    if history_used:
        namespace["_history_bins"] = _history_binner(history_parts, namespace)
    lines.append(f"    return ({', '.join(parts)}{',' if len(parts) == 1 else ''})")
    source = "\n".join(lines) + "\n"
    exec(compile(source, "<celery_aitp compiled request key>", "exec"), namespace)  # noqa: S102
    return namespace["request_key"]

