"""A strict reader of LightGBM's text model format, for loading models on the publish side
and for checking a text before LightGBM itself is given it.

LightGBM's own loader kills the whole process on some malformed files: it finds each tree
at the byte offset the ``tree_sizes`` header gives, so a file edited after LightGBM wrote it
(a value rounded, a space added) makes it read from the wrong place (SIGSEGV, or an
exception in its parallel tree parser, which aborts with "terminate called"); an empty
``objective``, a non-positive ``num_tree_per_iteration`` or a parameter line without ``:``
crash it too. That must never happen in a producer, a worker or the trainer. This reader
checks everything LightGBM relies on, reading the text the way LightGBM does (lines end at
``\\n``; a tree's keys end at its first empty line; values are split on spaces), and raises
:class:`ModelError` instead. A text it accepts loads and predicts in LightGBM.

It returns the same structure as ``Booster.dump_model()``, which :mod:`compiled` turns into
code; the trainer checks, before promoting, that the result reproduces LightGBM's
predictions.

Format (``Booster.model_to_string()``): a header of ``key=value`` lines, then one
``Tree=<i>`` block per tree, then ``end of trees``, feature importances and a
``parameters:`` section of ``[name: value]`` lines. ``tree_sizes`` in the header lists the
byte length of each tree block: its ``Tree=<i>`` line, its key lines and the empty lines
after them, up to the next ``Tree=`` line or ``end of trees``. In a tree, internal node
``i`` has ``split_feature[i]``, ``threshold[i]``, ``decision_type[i]`` (bit 0:
categorical, bit 1: default left, bits 2-3: missing type None/Zero/NaN) and children
``left_child[i]``/``right_child[i]`` (``~leaf`` for a leaf). A categorical threshold
indexes ``cat_boundaries``, which delimit 32-bit words of ``cat_threshold``.
"""

from __future__ import annotations

import math
import re
from typing import Any

from celery_aitp.errors import ModelError
from celery_aitp.predict.compiled import MAX_DEPTH

_MISSING = {0: "None", 1: "Zero", 2: "NaN"}
MAX_TREES = 10_000
MAX_LEAVES = 1 << 17
#: LightGBM reads at most this many ``key=value`` lines of a tree.
MAX_TREE_LINES = 22
#: Objectives of single-output regression (what the trainer fits); LightGBM crashes on
#: some other objective lines.
OBJECTIVES = frozenset({"regression", "regression_l1", "quantile", "huber", "fair", "poisson",
                        "mape", "gamma", "tweedie"})
#: Numbers as LightGBM writes them (``%.17g``); both of its parsers read these.
_INT = re.compile(r"-?[0-9]+")
_FLOAT = re.compile(r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?|-?inf|-?nan")
_PARAMETER = re.compile(r"\[[A-Za-z0-9_]+: [^\n]*\]")
_PRINTABLE = re.compile(r"[ -~]*")  # printable ASCII: a tree block's bytes are its characters
#: Per-tree arrays and their lengths (``n``: one per split, ``leaves``: one per leaf).
_ARRAYS = {
    "split_feature": ("n", int), "threshold": ("n", float), "decision_type": ("n", int),
    "left_child": ("n", int), "right_child": ("n", int), "split_gain": ("n", float),
    "internal_value": ("n", float), "internal_weight": ("n", float),
    "internal_count": ("n", int), "leaf_weight": ("leaves", float),
    "leaf_count": ("leaves", int),
}
_REQUIRED = ("split_feature", "threshold", "decision_type", "left_child", "right_child")

Tree = dict[str, str]


def _blocks(text: str) -> tuple[dict[str, str], list[Tree], list[int], list[str]]:
    """The header, each tree's ``key: value``, each tree block's byte length, and the
    lines after the trees; lines and keys exactly as LightGBM reads them."""
    if not isinstance(text, str) or not text.startswith("tree"):
        raise ModelError("not a LightGBM text model (it must start with 'tree')")
    if "\nend of trees" not in text:
        raise ModelError("the model text is truncated ('end of trees' is missing)")
    if "\r" in text or "\0" in text:
        raise ModelError("the model text holds a carriage return or NUL character (LightGBM "
                         "writes lines ending in \\n and counts tree_sizes in bytes)")
    lines = text.split("\n")
    header: dict[str, str] = {}
    at = 1
    while at < len(lines) and not lines[at].startswith("Tree="):
        _header_line(lines[at], header)
        at += 1
    trees: list[Tree] = []
    sizes: list[int] = []
    while at < len(lines) and lines[at] != "end of trees":
        start = at
        at += 1
        while at < len(lines) and not lines[at].startswith("Tree=") \
                and lines[at] != "end of trees":
            at += 1
        if len(trees) == MAX_TREES:
            raise ModelError(f"the model has more than {MAX_TREES} trees")
        trees.append(_tree_block(lines[start:at], len(trees)))
        sizes.append(sum(len(line) + 1 for line in lines[start:at]))
    if not trees:
        raise ModelError("the model has no trees")
    if at == len(lines):
        raise ModelError("the model text is truncated ('end of trees' is missing)")
    return header, trees, sizes, lines[at:]


def _header_line(line: str, header: dict[str, str]) -> None:
    if not line:
        return
    key, sep, value = line.partition("=")
    if sep and (not key or ("=" in value and key != "feature_names")):
        raise ModelError(f"malformed header line {line[:40]!r}")
    if key in header:
        raise ModelError(f"the header has {key[:40]!r} twice")
    header[key] = value if sep else "1"  # a bare key (average_output) is a flag


def _tree_block(lines: list[str], index: int) -> Tree:
    """One ``Tree=`` block: its key lines up to the first empty line, then empty lines."""
    if lines[0] != f"Tree={index}":
        raise ModelError(f"trees out of order at {lines[0][:40]!r}")
    if not all(_PRINTABLE.fullmatch(line) for line in lines):
        raise ModelError(f"tree {index} holds characters other than printable ASCII")
    try:
        end = lines.index("", 1)
    except ValueError:
        raise ModelError(f"tree {index} does not end with an empty line") from None
    if any(lines[end:]):
        raise ModelError(f"tree {index} has lines after its first empty line")
    if end - 1 > MAX_TREE_LINES:
        raise ModelError(f"tree {index} has more than {MAX_TREE_LINES} lines")
    tree: Tree = {}
    for line in lines[1:end]:
        key, sep, value = line.partition("=")
        if not sep:
            raise ModelError(f"tree {index}: line {line[:40]!r} is not key=value")
        if key in tree:
            raise ModelError(f"tree {index} has {key[:40]!r} twice")
        tree[key] = value
    return tree


def _int(value: str, what: str) -> int:
    text = value.strip(" ")
    if not _INT.fullmatch(text):
        raise ModelError(f"{what}: not an integer: {value[:40]!r}")
    try:
        return int(text)
    except ValueError:  # more digits than int() converts
        raise ModelError(f"{what}: not an integer: {value[:40]!r}") from None


def _values(raw: str, key: str, kind: type) -> list[Any]:
    """``raw`` split on spaces as LightGBM splits it; each a number LightGBM reads."""
    pattern = _INT if kind is int else _FLOAT
    tokens = [t for t in raw.split(" ") if t]
    if not all(pattern.fullmatch(t) for t in tokens):
        raise ModelError(f"{key}: malformed values")
    try:
        return [kind(t) for t in tokens]
    except ValueError:
        raise ModelError(f"{key}: malformed values") from None


def _array(tree: Tree, key: str, length: int, kind: type, upper_inf: bool = False,
           finite: bool = True) -> list[Any]:
    """``tree[key]`` as ``length`` values of ``kind``; floats finite, or +inf where
    ``upper_inf`` allows it (any, when not ``finite``)."""
    raw = tree.get(key)
    if raw is None:
        raise ModelError(f"a tree has no {key}")
    values = _values(raw, key, kind)
    if len(values) != length:
        raise ModelError(f"{key}: {len(values)} values, expected {length}")
    if kind is float and finite and not all(math.isfinite(v) or (upper_inf and v == math.inf)
                                            for v in values):
        raise ModelError(f"{key}: values must be finite{' or +inf' if upper_inf else ''}")
    return values


def _category_words(tree: Tree, num_cat: int) -> tuple[list[int], list[int]]:
    """``cat_boundaries`` and ``cat_threshold`` (LightGBM reads them whenever num_cat > 0)."""
    if num_cat == 0:
        return [0], []
    boundaries = _array(tree, "cat_boundaries", num_cat + 1, int)
    if boundaries[0] != 0 or any(a > b for a, b in zip(boundaries, boundaries[1:], strict=False)):
        raise ModelError("cat_boundaries must rise from 0")
    words = _array(tree, "cat_threshold", boundaries[-1], int)
    if not all(0 <= w < 1 << 32 for w in words):
        raise ModelError("cat_threshold: values must be 32-bit words")
    return boundaries, words


def _categories(boundaries: list[int], words: list[int], threshold: float) -> str:
    index = int(threshold) if math.isfinite(threshold) else -1
    if not 0 <= index < len(boundaries) - 1:
        raise ModelError("a categorical split points outside cat_boundaries")
    cats = [32 * w + bit for w in range(boundaries[index], boundaries[index + 1])
            for bit in range(32) if words[w] >> bit & 1]
    if not cats:
        raise ModelError("a categorical split has no categories")
    return "||".join(str(c - 32 * boundaries[index]) for c in cats)


def _tree_arrays(tree: Tree, leaves: int) -> dict[str, list[Any]]:
    """Every per-tree array LightGBM reads, each exactly as long as it expects."""
    n = leaves - 1
    num_cat = _int(tree["num_cat"], "num_cat")
    if not 0 <= num_cat <= n:
        raise ModelError(f"num_cat {num_cat} out of range")
    arrays: dict[str, list[Any]] = {}
    for key, (per, kind) in _ARRAYS.items():
        if key in tree or key in _REQUIRED:
            # +inf is LightGBM's last bin edge: every number goes left, only a missing
            # value right; statistics LightGBM does not predict with may be anything
            arrays[key] = _array(tree, key, n if per == "n" else leaves, kind,
                                 upper_inf=key == "threshold", finite=key == "threshold")
    arrays["cat_boundaries"], arrays["cat_threshold"] = _category_words(tree, num_cat)
    return arrays


def _leaf_values(tree: Tree) -> list[float]:
    """What LightGBM reads of every tree (num_cat too), ending with the leaf values."""
    leaves = _int(tree.get("num_leaves", ""), "num_leaves")
    if not 1 <= leaves <= MAX_LEAVES:
        raise ModelError(f"num_leaves {leaves} out of range")
    _int(tree.get("num_cat", ""), "num_cat")
    if _int(tree.get("is_linear", "0"), "is_linear"):
        raise ModelError("linear trees are not supported")
    if "shrinkage" in tree:
        _array(tree, "shrinkage", 1, float, finite=False)
    return _array(tree, "leaf_value", leaves, float)


def _tree(tree: Tree, n_features: int) -> dict[str, Any]:
    leaf_value = _leaf_values(tree)
    leaves = len(leaf_value)
    if leaves == 1:  # LightGBM reads nothing else of a one-leaf tree
        return {"tree_structure": {"leaf_value": leaf_value[0]}}
    arrays = _tree_arrays(tree, leaves)
    feature, threshold = arrays["split_feature"], arrays["threshold"]
    decision, left, right = arrays["decision_type"], arrays["left_child"], arrays["right_child"]
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
        if child >= leaves - 1 or child in seen_nodes:
            raise ModelError("a tree refers to a missing or repeated node")
        seen_nodes.add(child)
        bits = decision[child]
        if not 0 <= feature[child] < n_features or not 0 <= bits < 16 or bits >> 2 == 3:
            raise ModelError("a split refers to an unknown feature or decision type")
        out: dict[str, Any] = {
            "split_feature": feature[child],
            "default_left": bool(bits & 2),
            "missing_type": _MISSING[bits >> 2],
        }
        if bits & 1:
            out["decision_type"] = "=="
            out["threshold"] = _categories(arrays["cat_boundaries"], arrays["cat_threshold"],
                                           threshold[child])
        else:
            out["decision_type"] = "<="
            out["threshold"] = threshold[child]
        out["left_child"] = node(left[child], depth + 1)
        out["right_child"] = node(right[child], depth + 1)
        return out

    root = node(0)
    if len(seen_nodes) != leaves - 1 or len(seen_leaves) != leaves:
        raise ModelError("a tree has unreachable nodes")
    return {"tree_structure": root}


def _check_header(header: dict[str, str]) -> list[str]:
    """The header's fields LightGBM reads; returns the feature names."""
    for key in ("num_class", "label_index", "max_feature_idx", "feature_names",
                "feature_infos", "tree_sizes"):
        if key not in header:
            raise ModelError(f"the header has no {key}")
    if _int(header["num_class"], "num_class") != 1 or _int(
            header.get("num_tree_per_iteration", header["num_class"]),
            "num_tree_per_iteration") != 1:
        raise ModelError("only single-output models are supported (num_class and "
                         "num_tree_per_iteration must be 1)")
    _int(header["label_index"], "label_index")
    n_features = _int(header["max_feature_idx"], "max_feature_idx") + 1
    names = [name for name in header["feature_names"].split(" ") if name]
    if n_features < 1 or len(names) != n_features:
        raise ModelError(f"{len(names)} feature names for {n_features} features")
    if len([i for i in header["feature_infos"].split(" ") if i]) != n_features:
        raise ModelError(f"feature_infos does not have one entry per feature ({n_features})")
    if "monotone_constraints" in header and \
            len(_values(header["monotone_constraints"], "monotone_constraints", int)) \
            != n_features:
        raise ModelError("monotone_constraints does not have one value per feature")
    if "objective" in header:
        name, *options = [t for t in header["objective"].split(" ") if t] or [""]
        if name not in OBJECTIVES or any(option != "sqrt" for option in options):
            raise ModelError(f"objective {header['objective'][:40]!r} is not a regression "
                             "objective")
    return names


def _check_tree_sizes(header: dict[str, str], sizes: list[int]) -> None:
    """LightGBM reads tree ``i`` at the sum of the sizes before it: each must be exact."""
    listed = [s for s in header["tree_sizes"].split(" ") if s]
    if not all(s.isascii() and s.isdigit() and len(s) < 20 for s in listed):
        raise ModelError("tree_sizes is not a list of byte counts")
    if len(listed) != len(sizes):
        raise ModelError(f"tree_sizes lists {len(listed)} sizes for {len(sizes)} trees")
    for i, (said, size) in enumerate(zip(listed, sizes, strict=True)):
        if int(said) != size:
            raise ModelError(f"tree_sizes says tree {i} is {int(said)} bytes but it is {size} "
                             "(was the text edited after LightGBM wrote it?)")


def _check_parameters(lines: list[str]) -> None:
    """LightGBM's ``[name: value]`` lines (it crashes on one without ``: ``)."""
    inside = False
    for line in lines:
        if line == "parameters:":
            inside = True
        elif line == "end of parameters":
            return
        elif inside and line and not _PARAMETER.fullmatch(line):
            raise ModelError(f"malformed parameter line {line[:40]!r}")


def parse_model_text(text: str) -> dict[str, Any]:
    """The model as ``dump_model()`` would describe it; ModelError if anything is off,
    including anything LightGBM's own loader would crash on."""
    header, trees, sizes, rest = _blocks(text)
    names = _check_header(header)
    dump = {
        "num_class": 1,
        "num_tree_per_iteration": 1,
        "average_output": "average_output" in header,
        "objective": header.get("objective", ""),
        "feature_names": names,
        "tree_info": [_tree(tree, len(names)) for tree in trees],
    }
    _check_tree_sizes(header, sizes)
    _check_parameters(rest)
    return dump
