"""A strict reader of LightGBM's text model format, for loading models on the publish side.

LightGBM's own loader aborts the whole process on some malformed files (a truncated
model file kills the interpreter), which must never happen inside a producer or a
worker. This reader validates everything (array lengths, child indices, that every
node is reached exactly once) and raises :class:`ModelError` instead. It returns the
same structure as ``Booster.dump_model()``, which :mod:`compiled` turns into code; the
trainer checks, before promoting, that the result reproduces LightGBM's predictions.

Format (``Booster.model_to_string()``): a header of ``key=value`` lines, then one
``Tree=<i>`` block per tree, then ``end of trees``. In a tree, internal node ``i`` has
``split_feature[i]``, ``threshold[i]``, ``decision_type[i]`` (bit 0: categorical,
bit 1: default left, bits 2-3: missing type None/Zero/NaN) and children
``left_child[i]``/``right_child[i]`` (``~leaf`` for a leaf). A categorical threshold
indexes ``cat_boundaries``, which delimit 32-bit words of ``cat_threshold``.
"""

from __future__ import annotations

import math
from typing import Any

from celery_aitp.errors import ModelError
from celery_aitp.predict.compiled import MAX_DEPTH

_MISSING = {0: "None", 1: "Zero", 2: "NaN"}
MAX_TREES = 10_000
MAX_LEAVES = 1 << 17


def _blocks(text: str) -> tuple[dict[str, str], list[dict[str, str]]]:
    if not isinstance(text, str) or not text.startswith("tree"):
        raise ModelError("not a LightGBM text model (it must start with 'tree')")
    if "\nend of trees" not in text:
        raise ModelError("the model text is truncated ('end of trees' is missing)")
    body = text[: text.index("\nend of trees")]
    header: dict[str, str] = {}
    trees: list[dict[str, str]] = []
    current = header
    for raw in body.splitlines()[1:]:
        line = raw.strip()
        if not line:
            continue
        if line.startswith("Tree="):
            if line[5:] != str(len(trees)):
                raise ModelError(f"trees out of order at {line!r}")
            current = {}
            trees.append(current)
            continue
        key, sep, value = line.partition("=")
        current[key] = value if sep else "1"  # a bare key (average_output) is a flag
    if not trees or len(trees) > MAX_TREES:
        raise ModelError(f"the model has {len(trees)} trees")
    return header, trees


def _int(value: str, what: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ModelError(f"{what}: not an integer: {value[:40]!r}") from None


def _array(tree: dict[str, str], key: str, length: int, kind: type,
           upper_inf: bool = False) -> list[Any]:
    """``tree[key]`` as ``length`` values of ``kind``; floats finite, or +inf where
    ``upper_inf`` allows it."""
    raw = tree.get(key)
    if raw is None:
        raise ModelError(f"a tree has no {key}")
    try:
        values = [kind(v) for v in raw.split()]
    except ValueError:
        raise ModelError(f"{key}: malformed values") from None
    if len(values) != length:
        raise ModelError(f"{key}: {len(values)} values, expected {length}")
    if kind is float and not all(math.isfinite(v) or (upper_inf and v == math.inf)
                                 for v in values):
        raise ModelError(f"{key}: values must be finite{' or +inf' if upper_inf else ''}")
    return values


def _categories(tree: dict[str, str], threshold: float, num_cat: int) -> str:
    index = int(threshold) if math.isfinite(threshold) else -1
    if not 0 <= index < num_cat:
        raise ModelError("a categorical split points outside cat_boundaries")
    boundaries = _array(tree, "cat_boundaries", num_cat + 1, int)
    if boundaries[0] != 0 or any(a > b for a, b in zip(boundaries, boundaries[1:], strict=False)):
        raise ModelError("cat_boundaries must rise from 0")
    words = _array(tree, "cat_threshold", boundaries[-1], int)
    cats = [32 * w + bit for w in range(boundaries[index], boundaries[index + 1])
            for bit in range(32) if words[w] >> bit & 1]
    if not cats:
        raise ModelError("a categorical split has no categories")
    return "||".join(str(c - 32 * boundaries[index]) for c in cats)


def _tree(tree: dict[str, str], n_features: int) -> dict[str, Any]:
    leaves = _int(tree.get("num_leaves", ""), "num_leaves")
    if not 1 <= leaves <= MAX_LEAVES:
        raise ModelError(f"num_leaves {leaves} out of range")
    if _int(tree.get("is_linear", "0"), "is_linear"):
        return {"is_linear": True, "tree_structure": {}}
    leaf_value = _array(tree, "leaf_value", leaves, float)
    if leaves == 1:
        return {"tree_structure": {"leaf_value": leaf_value[0]}}
    n = leaves - 1
    feature = _array(tree, "split_feature", n, int)
    # +inf is LightGBM's last bin edge: every number goes left, only a missing value right
    threshold = _array(tree, "threshold", n, float, upper_inf=True)
    decision = _array(tree, "decision_type", n, int)
    left = _array(tree, "left_child", n, int)
    right = _array(tree, "right_child", n, int)
    num_cat = _int(tree.get("num_cat", "0"), "num_cat")
    seen_nodes: set[int] = set()
    seen_leaves: set[int] = set()

    def node(child: int, depth: int = 0) -> dict[str, Any]:
        if depth > MAX_DEPTH:
            raise ModelError(f"a tree is deeper than {MAX_DEPTH} levels")
        if child < 0:
            leaf = ~child
            if not 0 <= leaf < leaves or leaf in seen_leaves:
                raise ModelError("a tree refers to a missing or repeated leaf")
            seen_leaves.add(leaf)
            return {"leaf_value": leaf_value[leaf]}
        if child >= n or child in seen_nodes:
            raise ModelError("a tree refers to a missing or repeated node")
        seen_nodes.add(child)
        bits = decision[child]
        if not 0 <= feature[child] < n_features or bits >> 4:
            raise ModelError("a split refers to an unknown feature or decision type")
        out: dict[str, Any] = {
            "split_feature": feature[child],
            "default_left": bool(bits & 2),
            "missing_type": _MISSING.get((bits >> 2) & 3, "?"),
        }
        if bits & 1:
            out["decision_type"] = "=="
            out["threshold"] = _categories(tree, threshold[child], num_cat)
        else:
            out["decision_type"] = "<="
            out["threshold"] = threshold[child]
        out["left_child"] = node(left[child], depth + 1)
        out["right_child"] = node(right[child], depth + 1)
        return out

    root = node(0)
    if len(seen_nodes) != n or len(seen_leaves) != leaves:
        raise ModelError("a tree has unreachable nodes")
    return {"tree_structure": root}


def parse_model_text(text: str) -> dict[str, Any]:
    """The model as ``dump_model()`` would describe it; ModelError if anything is off."""
    header, trees = _blocks(text)
    n_features = _int(header.get("max_feature_idx", ""), "max_feature_idx") + 1
    names = header.get("feature_names", "").split()
    if len(names) != n_features:
        raise ModelError(f"{len(names)} feature names for {n_features} features")
    return {
        "num_class": _int(header.get("num_class", "1"), "num_class"),
        "num_tree_per_iteration": _int(header.get("num_tree_per_iteration", "1"),
                                       "num_tree_per_iteration"),
        "average_output": "average_output" in header,
        "objective": header.get("objective", ""),
        "feature_names": names,
        "tree_info": [_tree(tree, n_features) for tree in trees],
    }
