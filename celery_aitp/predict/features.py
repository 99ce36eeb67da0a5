"""Publish-time features of a task, one pure module for training and for the publish path.

Everything here is deterministic and cheap, does no I/O and never raises, whatever the
arguments are (nested, huge, NaN, objects of any type). The same functions build the
rows the trainer learns from (from observation records) and the vector the publish path
predicts from, so the two cannot drift apart.

Feature list (schema 3), in vector order:

========================  ==================================================================
``task``, ``tenant``      categorical codes from the model's vocabulary (unknown: missing)
``n_args``, ``n_kwargs``  number of positional and keyword arguments
``args_bytes``,           length of Celery's ``argsrepr`` / ``kwargsrepr`` headers (a size
``kwargs_bytes``          proxy Celery computes anyway; capped by Celery at about 1 KiB)
``arg0`` .. ``arg3``      value of positional argument i (see :func:`value_of`)
``hint_s``                the task's declared ``runtime_hint_s``
``retries``               how many times the task was retried already
``hour``, ``weekday``     UTC hour (0-23) and weekday (Monday 0) of publication
``h_last2``, ``h_mean``,  mean of the last two and of the last up-to-20 runtimes of the same
``h_count``               (tenant, task), and how many runs that history holds (capped)
``h_last``, ``h_prev``    its last and second-to-last runtime
``h_spread``              ``|log(h_last / h_prev)|``: near 0 when the last two agree
``h_median``              median of its last up-to-20 runtimes
``h_median_r``,           ``h_median / h_last2`` and ``h_mean / h_last2``: how far the last
``h_mean_r``              two lie from the pair's usual runtime (a tree cannot divide)
``h_trend``               ``log(h_last / h_prev)``: the last run longer (> 0) or shorter
                          than the one before (< 0)
``t_last2``               mean of the tenant's last two runs, whatever the task
``base_s``                the history estimate the model corrects (:func:`base_of`)
``kw.<name>``             value of keyword argument ``name``, for the names the model chose
========================  ==================================================================

A value is the number itself for ints and floats (NaN stays missing, infinities are
clamped), 0/1 for booleans, the length for strings, bytes and containers, and missing for
anything else (``None``, objects): we never call user code to size an object.
"""

from __future__ import annotations

import hashlib
import math
import numbers
from collections.abc import Iterable, Mapping
from itertools import islice
from typing import Any

NAN = math.nan
#: Values beyond this are clamped, so every feature fits a float64 and compares sanely.
BIG = 1e300
#: Positional arguments that get their own feature.
POSITIONAL = 4
#: Keyword arguments a record keeps values of (sorted by name), so training can choose.
MAX_RECORDED_KWARGS = 64
#: Runs of one (tenant, task) the history features look at.
HISTORY_DEPTH = 20
#: ``h_count`` is capped here: beyond it, more history says nothing new.
HISTORY_COUNT_CAP = 100
#: Feature schema version; a model trained on another schema is refused.
SCHEMA = 3

BASE_FEATURES: tuple[str, ...] = (
    "task", "tenant", "n_args", "n_kwargs", "args_bytes", "kwargs_bytes",
    *(f"arg{i}" for i in range(POSITIONAL)),
    "hint_s", "retries", "hour", "weekday", *(
        "h_last2", "h_mean", "h_count", "h_last", "h_prev", "h_spread", "h_median",
        "h_median_r", "h_mean_r", "h_trend", "t_last2", "base_s"),
)
#: The history features, in the order of a history tuple (:func:`history_features`).
HISTORY_FEATURES: tuple[str, ...] = BASE_FEATURES[BASE_FEATURES.index("h_last2"):]
CATEGORICAL: tuple[str, ...] = ("task", "tenant")
#: The argument features a worker records with each run (plus ``kw.<name>`` entries).
ARGUMENT_FEATURES: tuple[str, ...] = BASE_FEATURES[2:6 + POSITIONAL]
KWARG_PREFIX = "kw."

_POSITIONAL_NAMES = tuple(f"arg{i}" for i in range(POSITIONAL))
_SIZED = frozenset({str, bytes, bytearray, list, tuple, dict, set, frozenset})
_SIZED_BASES = (str, bytes, bytearray, list, tuple, dict, set, frozenset)
History = tuple[float, float, int, float, float, float, float, float, float, float, float,
                float]
_NO_HISTORY: History = (NAN, NAN, 0, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN)
#: Runtimes are clipped here before a ratio or a log (a zero-second run).
_TINY = 1e-4


def value_of(value: Any) -> float | int:
    """One argument as a number: itself, 0/1, its length, or NaN. Never raises."""
    kind = type(value)
    if kind is int or kind is float:
        if -BIG < value < BIG:
            return value
        return NAN if value != value else (BIG if value > 0 else -BIG)
    if kind in _SIZED:
        return len(value)
    if kind is bool:
        return 1 if value else 0
    if value is None:
        return NAN
    return _value_of_other(value)


def _value_of_other(value: Any) -> float | int:
    """Subclasses and numeric types from other libraries (numpy scalars, enums)."""
    try:
        if isinstance(value, (bool, int, float, numbers.Real)):
            return value_of(float(value))
        if isinstance(value, _SIZED_BASES):
            return int(len(value))
        kind = type(value)
        if kind.__module__ == "numpy" and kind.__name__ == "ndarray":
            return int(value.size)
    except Exception:  # a hostile __float__/__len__ must not reach the caller
        return NAN
    return NAN


def repr_length(text: Any) -> float | int:
    """Length of an ``argsrepr``/``kwargsrepr`` header, or NaN when there is none."""
    return len(text) if type(text) is str else NAN


def hour_and_weekday(published_at: Any) -> tuple[float | int, float | int]:
    """UTC hour (0-23) and weekday (Monday is 0) of an epoch time; NaN when unusable."""
    if type(published_at) is not float and type(published_at) is not int:
        return NAN, NAN
    if not -BIG < published_at < BIG:
        return NAN, NAN
    days, seconds = divmod(int(published_at), 86400)
    return seconds // 3600, (days + 3) % 7  # 1970-01-01 was a Thursday


def argument_features(args: Any, kwargs: Any, args_bytes: Any = NAN,
                      kwargs_bytes: Any = NAN) -> dict[str, float | int]:
    """The argument features a worker records with a run, by name.

    ``kw.<name>`` entries are kept for the first :data:`MAX_RECORDED_KWARGS` keyword
    names in sorted order; the trainer picks the frequent ones as model features.
    """
    args = args if type(args) is tuple or type(args) is list else ()
    kwargs = kwargs if isinstance(kwargs, dict) else {}
    out: dict[str, float | int] = {
        "n_args": len(args),
        "n_kwargs": len(kwargs),
        "args_bytes": _number_or_nan(args_bytes),
        "kwargs_bytes": _number_or_nan(kwargs_bytes),
    }
    for i in range(POSITIONAL):
        out[f"arg{i}"] = value_of(args[i]) if i < len(args) else NAN
    try:
        names = sorted(k for k in kwargs if type(k) is str)[:MAX_RECORDED_KWARGS]
        for name in names:
            out[KWARG_PREFIX + name] = value_of(kwargs[name])
    except Exception:  # noqa: S110 - a dict subclass with a broken __iter__/__getitem__
        return out
    return out


#: Keyword arguments :func:`magnitude_class` looks at (in the call's order).
MAGNITUDE_KWARGS = 16
#: Magnitude classes above this one are folded into it (2**40 is beyond any size).
MAGNITUDE_CAP = 40


def magnitude_class(args: Any, kwargs: Any) -> int | None:
    """The call's size class for the cold start: the doubling its largest argument value
    falls in (:func:`value_of`: a number itself, the length of a string or container),
    from the first :data:`POSITIONAL` positional and :data:`MAGNITUDE_KWARGS` keyword
    arguments. 0 for values below 1, None when no argument has a value. Never raises.

    Calls of one task whose arguments differ by a factor of two or more often differ in
    runtime too (rows, pixels, items); until a model learns which argument matters, the
    history of calls of the same magnitude tells short calls from long ones.
    """
    largest = -1.0
    positional = args if type(args) is tuple or type(args) is list else ()
    named = kwargs if type(kwargs) is dict else {}
    try:
        values = [*positional[:POSITIONAL], *islice(named.values(), MAGNITUDE_KWARGS)]
    except Exception:  # a container subclass with a broken accessor
        return None
    for value in values:
        number = value_of(value)
        if number == number and abs(number) > largest:
            largest = abs(number)
    if largest < 0:
        return None
    if largest < 1:
        return 0
    return min(MAGNITUDE_CAP, math.frexp(largest)[1])


def _number_or_nan(value: Any) -> float | int:
    if type(value) is int or type(value) is float:
        return value_of(value)
    return NAN


def history_features(runtimes: Iterable[float], count: int,
                     tenant_runtimes: Iterable[float] = ()) -> History:
    """The history tuple from the newest-first recent runtimes of the (tenant, task) and
    of the tenant (any task); see the feature list above."""
    recent = [r for r in runtimes][:HISTORY_DEPTH]
    tenant = [r for r in tenant_runtimes][:2]
    t_last2 = sum(tenant) / len(tenant) if tenant else NAN
    if not recent:
        return (NAN, NAN, 0, NAN, NAN, NAN, NAN, NAN, NAN, NAN, t_last2, t_last2)
    last2 = recent[:2]
    h_last2 = sum(last2) / len(last2)
    h_prev = recent[1] if len(recent) > 1 else NAN
    trend = (math.log(max(recent[0], _TINY) / max(h_prev, _TINY))
             if h_prev == h_prev else NAN)
    ordered = sorted(recent)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    mean = sum(recent) / len(recent)
    scale = max(h_last2, _TINY)
    return (h_last2, mean, min(int(count), HISTORY_COUNT_CAP), recent[0], h_prev,
            abs(trend), median, max(median, _TINY) / scale, max(mean, _TINY) / scale, trend,
            t_last2, h_last2)


def base_of(history: tuple[float, ...] | None, default_s: float) -> float:
    """The estimate a residual model corrects: the pair's last two, else the tenant's,
    else ``default_s`` (the training median). Always a positive number."""
    if history is not None:
        base = history[-1]
        if base == base and base > 0:
            return base
    return default_s


#: Argument features left out of a call's signature: the sizes of Celery's argument
#: reprs follow the values the signature already holds (and a producer's and a worker's
#: reprs may be cut at different lengths).
_UNSIGNED = frozenset({"args_bytes", "kwargs_bytes"})


def call_signature(arguments: Mapping[str, Any]) -> str:
    """A short stable name for a call's argument values (``arguments``: what
    :func:`argument_features` gives, or a run's recorded ``features``).

    Calls of a task with the same values usually take the same time: a report for the
    same account, a job resubmitted with the same size and time request; the history
    keeps the last runs of each call (:mod:`~celery_aitp.predict.history`). Values are
    read as :func:`value_of` reads them, so a string counts by its length and the
    signature holds no argument's content; missing values (None, NaN, an object) are
    one token. Stable across processes (not Python's ``hash``).
    """
    parts = []
    for name in sorted(arguments, key=str):  # a hostile mapping's keys need not compare
        if name in _UNSIGNED:
            continue
        value = arguments[name]
        if type(value) is not int and type(value) is not float:
            value = NAN
        parts.append(f"{name}={'-' if value != value else repr(float(value))}")
    return hashlib.blake2b(";".join(parts).encode(), digest_size=8).hexdigest()


class FeatureSpec:
    """The feature vector a given model expects: base features plus its keyword names.

    Built once per model (from its metadata), then used for every publish and for every
    training row, so both sides agree by construction.
    """

    __slots__ = ("_recorded_kwargs", "kwarg_names", "names", "tasks", "tenants")

    def __init__(self, kwarg_names: Iterable[str] = (), tasks: Iterable[str] = (),
                 tenants: Iterable[str] = ()) -> None:
        self.kwarg_names: tuple[str, ...] = tuple(kwarg_names)
        self.names: tuple[str, ...] = BASE_FEATURES + tuple(
            KWARG_PREFIX + n for n in self.kwarg_names)
        self.tasks: dict[str, int] = {name: i for i, name in enumerate(tasks)}
        self.tenants: dict[str, int] = {name: i for i, name in enumerate(tenants)}
        self._recorded_kwargs = tuple(KWARG_PREFIX + n for n in self.kwarg_names)

    def vector(self, task: str, tenant: str, args: Any, kwargs: Any, args_bytes: Any,
               kwargs_bytes: Any, hint_s: Any, retries: Any, published_at: Any,
               history: tuple[float, ...] | None) -> tuple[float | int, ...]:
        """The feature vector at publish time (``history`` from the history source)."""
        if type(args) is not tuple and type(args) is not list:
            args = ()
        n_args = len(args)
        if not isinstance(kwargs, dict):
            kwargs = {}
        hour: float | int
        weekday: float | int
        if type(published_at) is float and 0.0 <= published_at < 1e12:  # the usual case
            days, seconds = divmod(int(published_at), 86400)
            hour, weekday = seconds // 3600, (days + 3) % 7
        else:
            hour, weekday = hour_and_weekday(published_at)
        hist = history or _NO_HISTORY
        try:
            get = kwargs.get
            named = [value_of(get(name)) for name in self.kwarg_names]
        except Exception:  # a dict subclass whose reads raise: its values are missing
            named = [NAN] * len(self.kwarg_names)
        return (
            self.tasks.get(task, NAN), self.tenants.get(tenant, NAN), n_args, len(kwargs),
            args_bytes if type(args_bytes) is int else _number_or_nan(args_bytes),
            kwargs_bytes if type(kwargs_bytes) is int else _number_or_nan(kwargs_bytes),
            value_of(args[0]) if n_args > 0 else NAN,
            value_of(args[1]) if n_args > 1 else NAN,
            value_of(args[2]) if n_args > 2 else NAN,
            value_of(args[3]) if n_args > 3 else NAN,
            NAN if hint_s is None else _number_or_nan(hint_s),
            retries if type(retries) is int else NAN,
            hour, weekday, *hist, *named,
        )

    def row(self, task: str, tenant: str, arguments: Mapping[str, Any], hint_s: Any,
            retries: Any, published_at: Any,
            history: tuple[float, ...] | None) -> list[float]:
        """A training row from recorded argument features (see :func:`argument_features`)."""
        hour, weekday = hour_and_weekday(published_at)
        hist = history or _NO_HISTORY
        get = arguments.get
        values = [
            self.tasks.get(task, NAN), self.tenants.get(tenant, NAN),
            get("n_args", NAN), get("n_kwargs", NAN), get("args_bytes", NAN),
            get("kwargs_bytes", NAN),
            *(get(name, NAN) for name in _POSITIONAL_NAMES),
            _number_or_nan(hint_s), retries if type(retries) is int else NAN,
            hour, weekday, *hist,
            *(get(name, NAN) for name in self._recorded_kwargs),
        ]
        # the common cases of _as_float inline: it runs for every value of every row
        return [v if type(v) is float and -BIG < v < BIG
                else float(v) if type(v) is int and -BIG < v < BIG else _as_float(v)
                for v in values]


def _as_float(value: Any) -> float:
    """Recorded features come from JSON: anything not a number is missing."""
    if type(value) is float:
        if -BIG < value < BIG:
            return value
        return NAN if value != value else math.copysign(BIG, value)
    if type(value) is int:
        return float(value_of(value))
    return NAN
