"""LightGBM trees compiled to plain Python, plus a cache keyed by the model's own splits.

One call of LightGBM's single-row ``predict`` costs tens of microseconds; the publish
path cannot afford it. A model is turned, once and in the background, into:

* one generated function per forest: straight-line nested ``if``s over local variables,
  reproducing LightGBM's decision rules exactly (missing values, zero-as-missing,
  categorical bitsets) and summing leaves in LightGBM's order, so the result is the same
  double LightGBM computes;
* a key function that maps a feature vector to the interval each used feature falls in
  between the model's own thresholds (and the category for categorical features). Two
  vectors with the same key take the same path through every tree, so the prediction is
  cached by key: most publishes are a key and a dict lookup.

The generated source contains only numbers formatted here (feature indices, thresholds
(finite, or LightGBM's ``inf`` upper bound), finite leaf values, category sets), never
text from the model file.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from celery_aitp.errors import ModelError

#: LightGBM's ``kZeroThreshold``: values this close to 0 count as zero. LightGBM declares
#: it ``const double kZeroThreshold = 1e-35f``: the float 1e-35 widened to a double,
#: 1.0000000180025095e-35, not the double 1e-35 (a value between the two is zero to it).
ZERO_THRESHOLD = 1.0000000180025095e-35
#: Entries kept in a prediction cache before it starts over.
CACHE_SIZE = 65_536
#: Python refuses deeper nesting; LightGBM trees deeper than this are refused.
MAX_DEPTH = 90
#: Steps per doubling of the grid the publish path's predictions are rounded to.
GRID_STEPS = 16


def on_grid(seconds: float) -> float:
    """``seconds`` rounded to the nearest of ``2 ** (k / GRID_STEPS)``: at most 2.2% off,
    far inside any model's error. Zero, infinity and NaN are returned as they are.

    Why: the decision memo keys on the prediction, and forests' sums that differ only in
    the fourth digit would each be a key of their own (each key's first task runs the
    pipeline's tail)."""
    if not 0.0 < seconds < math.inf:
        return seconds
    return 2.0 ** (round(math.log2(seconds) * GRID_STEPS) / GRID_STEPS)

Vector = Sequence[float]
Forest = Callable[[Vector], float]


class _Usage:
    """How a forest uses each feature: numeric thresholds or category sets."""

    def __init__(self) -> None:
        self.thresholds: dict[int, set[float]] = {}
        self.categories: dict[int, set[int]] = {}

    def merge(self, other: _Usage) -> None:
        for j, ts in other.thresholds.items():
            self.thresholds.setdefault(j, set()).update(ts)
        for j, cs in other.categories.items():
            self.categories.setdefault(j, set()).update(cs)


def _number(value: Any, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ModelError(f"{what} is not a number: {value!r}") from None
    if not math.isfinite(number):
        raise ModelError(f"{what} is not finite: {value!r}")
    return number


def _threshold(node: Mapping[str, Any]) -> float:
    """A numeric split's threshold: finite, or +inf.

    LightGBM writes ``inf`` for a split at its last bin's upper bound: every number goes
    left and only a missing value goes right.

    LightGBM's predictor reads every input within ``ZERO_THRESHOLD`` of 0 as 0.0 (it
    leaves such values out of the row it builds), so a threshold inside that band is
    moved to the band's edge on its side: ``v <= t`` for ``-ZERO_THRESHOLD <= t < 0``
    holds for LightGBM exactly when ``v < -ZERO_THRESHOLD``, and for
    ``0 <= t < ZERO_THRESHOLD`` exactly when ``v <= ZERO_THRESHOLD``. (LightGBM puts bin
    bounds at ``-ZERO_THRESHOLD``: a value there went the other way than in LightGBM.)
    """
    value = node.get("threshold")
    if value == math.inf:
        return math.inf
    t = _number(value, "threshold")
    if -ZERO_THRESHOLD <= t < 0.0:
        return _ZERO_EDGES[0]
    if 0.0 <= t < ZERO_THRESHOLD:
        return ZERO_THRESHOLD
    return t


def _literal(t: float) -> str:
    """``t`` as Python source: ``repr`` for a finite number, ``1e999`` (which is +inf) else."""
    return repr(t) if math.isfinite(t) else "1e999"


def _feature(node: Mapping[str, Any], n_features: int) -> int:
    j = node.get("split_feature")
    if type(j) is not int or not 0 <= j < n_features:
        raise ModelError(f"split on feature {j!r}, the model has {n_features} features")
    return j


def _categories(node: Mapping[str, Any]) -> set[int]:
    try:
        return {int(c) for c in str(node["threshold"]).split("||")}
    except (KeyError, ValueError):
        raise ModelError(f"bad categorical split {node.get('threshold')!r}") from None


def _condition(node: Mapping[str, Any], n_features: int, usage: _Usage) -> str:
    """A Python expression that is true when LightGBM sends a value left at ``node``."""
    j = _feature(node, n_features)
    f = f"f{j}"
    if node.get("decision_type") == "==":
        cats = _categories(node)
        usage.categories.setdefault(j, set()).update(cats)
        # LightGBM 4 sends NaN and negative values right: neither is in the set. Inputs
        # are integer codes (FeatureSpec makes them), so no truncation is needed.
        return f"{f} in {{{', '.join(str(c) for c in sorted(cats))}}}"
    if node.get("decision_type") != "<=":
        raise ModelError(f"unsupported decision type {node.get('decision_type')!r}")
    missing = node.get("missing_type", "None")
    t = _threshold(node)
    usage.thresholds.setdefault(j, set()).add(t)
    left = bool(node.get("default_left"))
    ts = _literal(t)
    if missing == "NaN":
        return f"not {f} > {ts}" if left else f"{f} <= {ts}"
    if missing == "Zero":
        usage.thresholds[j].update(_ZERO_EDGES)
        zero = f"{-ZERO_THRESHOLD!r} <= {f} <= {ZERO_THRESHOLD!r}"
        return f"(not {f} > {ts} or {zero})" if left else f"({f} <= {ts} and not {zero})"
    if missing != "None":
        raise ModelError(f"unsupported missing type {missing!r}")
    # NaN is read as 0.0: it goes where 0.0 goes.
    return f"not {f} > {ts}" if t >= 0.0 else f"{f} <= {ts}"


_ZERO_EDGES = (math.nextafter(-ZERO_THRESHOLD, -math.inf), ZERO_THRESHOLD)


def _emit(node: Mapping[str, Any], depth: int, lines: list[str], n_features: int,
          usage: _Usage, total: str) -> None:
    pad = "    " * depth
    if "leaf_value" in node:
        lines.append(f"{pad}{total} += {_number(node['leaf_value'], 'leaf value')!r}")
        return
    if depth > MAX_DEPTH:
        raise ModelError(f"a tree is deeper than {MAX_DEPTH} levels")
    try:
        left, right = node["left_child"], node["right_child"]
    except KeyError:
        raise ModelError("a split node has no children") from None
    lines.append(f"{pad}if {_condition(node, n_features, usage)}:")
    _emit(left, depth + 1, lines, n_features, usage, total)
    lines.append(f"{pad}else:")
    _emit(right, depth + 1, lines, n_features, usage, total)


def _unpack_line(n_features: int) -> str:
    names = ", ".join(f"f{j}" for j in range(n_features))
    return f"    ({names},) = x"


def _trees(dump: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    if dump.get("num_class", 1) != 1 or dump.get("num_tree_per_iteration", 1) != 1:
        raise ModelError("only single-output regression models are supported")
    if dump.get("average_output"):
        raise ModelError("random-forest (averaged) models are not supported")
    trees = dump.get("tree_info")
    if not isinstance(trees, list) or not trees:
        raise ModelError("the model has no trees")
    roots = []
    for tree in trees:
        if not isinstance(tree, Mapping) or tree.get("is_linear"):
            raise ModelError("linear trees are not supported")
        root = tree.get("tree_structure")
        if not isinstance(root, Mapping):
            raise ModelError("a tree has no structure")
        roots.append(root)
    return roots


def compile_forests(dumps: Sequence[Mapping[str, Any]], n_features: int
                    ) -> tuple[Callable[[Vector], tuple[float, ...]], _Usage, str]:
    """One function returning the raw score of each LightGBM ``dump_model()`` document.

    All forests share one call and one unpacking of the vector. Raises
    :class:`ModelError` for anything this compiler does not reproduce exactly
    (multi-class, averaged output, linear trees, unknown decision types).
    """
    usage = _Usage()
    lines = ["def forests(x):", _unpack_line(n_features)]
    totals = [f"s{k}" for k in range(len(dumps))]
    for total, dump in zip(totals, dumps, strict=True):
        lines.append(f"    {total} = 0.0")
        for root in _trees(dump):
            _emit(root, 1, lines, n_features, usage, total)
    lines.append(f"    return ({', '.join(totals)},)")
    source = "\n".join(lines) + "\n"
    namespace: dict[str, Any] = {}
    try:
        exec(compile(source, "<celery_aitp compiled forests>", "exec"), namespace)  # noqa: S102
    except (SyntaxError, RecursionError, MemoryError) as exc:
        raise ModelError(f"the model could not be compiled: {exc}") from None
    return namespace["forests"], usage, source


def compile_forest(dump: Mapping[str, Any], n_features: int) -> tuple[Forest, _Usage, str]:
    """A function summing the raw scores of one LightGBM ``dump_model()`` document."""
    forests, usage, source = compile_forests([dump], n_features)
    return (lambda x: forests(x)[0]), usage, source


def compile_key(usage: _Usage, n_features: int) -> Callable[[Vector], tuple[Any, ...]]:
    """The cache key: per used feature, its interval between thresholds, or its category.

    NaN gets its own bin (-1); categories no split mentions share one bin (-2). A
    categorical value must be an integer code (what :class:`FeatureSpec` produces).
    """
    parts: list[str] = []
    namespace: dict[str, Any] = {"_bl": bisect_left}
    for j in sorted(set(usage.thresholds) | set(usage.categories)):
        f = f"f{j}"
        if j in usage.categories:
            namespace[f"C{j}"] = frozenset(usage.categories[j])
            parts.append(f"(({f} if {f} in C{j} else -2) if {f} == {f} else -1)")
        else:
            namespace[f"T{j}"] = tuple(sorted(usage.thresholds[j]))
            parts.append(f"(_bl(T{j}, {f}) if {f} == {f} else -1)")
    body = ", ".join(parts) + ("," if len(parts) == 1 else "")
    source = f"def key(x):\n{_unpack_line(n_features)}\n    return ({body})\n"
    exec(compile(source, "<celery_aitp compiled key>", "exec"), namespace)  # noqa: S102
    return namespace["key"]


def _bin_condition(node: Mapping[str, Any], position: dict[int, int],
                   thresholds: Mapping[int, tuple[float, ...]]) -> str:
    """``_condition`` over the cache key: the interval index of each used feature.

    For a threshold ``t = T[k]`` of a feature's sorted thresholds ``T`` and a non-NaN
    value ``f`` with key ``b = bisect_left(T, f)``: ``f <= t`` exactly when ``b <= k``.
    NaN has key -1 and the zero band ``[-ZERO_THRESHOLD, ZERO_THRESHOLD]`` is the keys
    between the two zero edges, so each of LightGBM's missing-value rules has its exact
    integer form, and a category keeps its own code (others are -2 or -1, in no set).
    """
    j = node["split_feature"]
    b = f"b{position[j]}"
    if node.get("decision_type") == "==":
        return f"{b} in {{{', '.join(str(c) for c in sorted(_categories(node)))}}}"
    ts = thresholds[j]
    k = ts.index(_threshold(node))
    missing = node.get("missing_type", "None")
    left = bool(node.get("default_left"))
    if missing == "NaN":
        nan_left = left
    elif missing == "Zero":
        low, high = ts.index(_ZERO_EDGES[0]) + 1, ts.index(_ZERO_EDGES[1])
        zero = f"{low} <= {b} <= {high}"
        return f"({b} <= {k} or {zero})" if left else f"(0 <= {b} <= {k} and not {zero})"
    else:  # NaN goes where 0.0 goes
        nan_left = ts[k] >= 0.0
    return f"{b} <= {k}" if nan_left else f"0 <= {b} <= {k}"


def _emit_bins(node: Mapping[str, Any], depth: int, lines: list[str],
               position: dict[int, int], thresholds: Mapping[int, tuple[float, ...]],
               total: str) -> None:
    pad = "    " * depth
    if "leaf_value" in node:
        lines.append(f"{pad}{total} += {_number(node['leaf_value'], 'leaf value')!r}")
        return
    lines.append(f"{pad}if {_bin_condition(node, position, thresholds)}:")
    _emit_bins(node["left_child"], depth + 1, lines, position, thresholds, total)
    lines.append(f"{pad}else:")
    _emit_bins(node["right_child"], depth + 1, lines, position, thresholds, total)


def compile_key_forests(dumps: Sequence[Mapping[str, Any]], usage: _Usage
                        ) -> Callable[[tuple[Any, ...]], tuple[float, ...]] | None:
    """The forests of :func:`compile_forests` over the cache key of :func:`compile_key`.

    A cache miss then walks integer intervals the key already computed instead of the
    feature vector: the same leaves in the same order, so the same doubles. None when a
    feature is split both as a number and as a category (the vector is walked then).
    Call only with dumps :func:`compile_forests` accepted.
    """
    if set(usage.thresholds) & set(usage.categories):
        return None
    used = sorted(set(usage.thresholds) | set(usage.categories))
    position = {j: p for p, j in enumerate(used)}
    thresholds = {j: tuple(sorted(ts)) for j, ts in usage.thresholds.items()}
    names = ", ".join(f"b{p}" for p in range(len(used)))
    lines = ["def key_forests(k):", f"    ({names},) = k" if used else "    pass"]
    totals = [f"s{i}" for i in range(len(dumps))]
    for total, dump in zip(totals, dumps, strict=True):
        lines.append(f"    {total} = 0.0")
        for root in _trees(dump):
            _emit_bins(root, 1, lines, position, thresholds, total)
    lines.append(f"    return ({', '.join(totals)},)")
    namespace: dict[str, Any] = {}
    try:
        exec(compile("\n".join(lines) + "\n", "<celery_aitp compiled key forests>", "exec"),  # noqa: S102
             namespace)
    except (SyntaxError, RecursionError, MemoryError):
        return None
    return namespace["key_forests"]


class CompiledRuntimeModel:
    """Median and upper-quantile runtime (seconds) of a feature vector, in microseconds.

    The p50 forest predicts log runtime; the p90 forest predicts how far the 0.9
    quantile of log runtime lies above it. ``predict`` returns ``(p50_s, p90_s, hit)``
    where ``hit`` says whether the cache answered, each :func:`on_grid` (rounded once,
    when cached); ``evaluate`` gives the forests' exact values.
    """

    def __init__(self, p50_dump: Mapping[str, Any], p90_dump: Mapping[str, Any],
                 n_features: int, cache_size: int = CACHE_SIZE) -> None:
        self.n_features = n_features
        self.scores, usage, _ = compile_forests([p50_dump, p90_dump], n_features)
        self.key = compile_key(usage, n_features)
        #: The same forests over the key (what a cache miss walks), or None.
        self.key_scores = compile_key_forests([p50_dump, p90_dump], usage)
        #: Per used feature: its sorted thresholds (numeric) or its split categories.
        self.thresholds = {j: tuple(sorted(ts)) for j, ts in usage.thresholds.items()}
        self.categories = {j: frozenset(cs) for j, cs in usage.categories.items()}
        self.used_features = sorted(set(self.thresholds) | set(self.categories))
        self.cache: dict[tuple[Any, ...], tuple[float, float]] = {}
        self.cache_size = cache_size

    def predict(self, x: Vector) -> tuple[float, float, bool]:
        key = self.key(x)
        if self.key_scores is not None:
            return self.predict_key(key)
        found = self.cache.get(key)
        if found is not None:
            return found[0], found[1], True
        p50, p90 = self.evaluate(x)
        p50, p90 = on_grid(p50), on_grid(p90)
        cache = self.cache
        if len(cache) >= self.cache_size:
            cache.clear()
        cache[key] = (p50, p90)
        return p50, p90, False

    def predict_key(self, key: tuple[Any, ...]) -> tuple[float, float, bool]:
        """``predict`` from the cache key alone (needs ``key_scores``)."""
        found = self.cache.get(key)
        if found is not None:
            return found[0], found[1], True
        low, offset = self.key_scores(key)  # type: ignore[misc]
        p50 = on_grid(_seconds(low))
        p90 = on_grid(_seconds(low + offset)) if offset > 0.0 else p50
        cache = self.cache
        if len(cache) >= self.cache_size:
            cache.clear()
        cache[key] = (p50, p90)
        return p50, p90, False

    def check_key_scores(self, x: Vector) -> None:
        """Walk ``x`` both ways; on any difference stop using the key forests (safe)."""
        if self.key_scores is not None and self.key_scores(self.key(x)) != self.scores(x):
            self.key_scores = None

    def evaluate(self, x: Vector) -> tuple[float, float]:
        """Run both forests (no cache): (p50 seconds, p90 seconds), p90 never below p50."""
        low, offset = self.scores(x)
        p50 = _seconds(low)
        return p50, _seconds(low + offset) if offset > 0.0 else p50

    def raw(self, x: Vector) -> tuple[float, float]:
        """Log-runtime p50 and p90 scores, as LightGBM's ``raw_score`` sums give them."""
        low, offset = self.scores(x)
        return low, low + offset


def _seconds(log_runtime: float) -> float:
    return math.exp(log_runtime) if log_runtime < 700.0 else math.inf
