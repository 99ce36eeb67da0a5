"""Small statistics over record lists (pure, tolerant of missing or malformed fields)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from celery_aitp.numbers import finite_number


def number(value: Any) -> float | None:
    """A finite float, or None for anything else (older records, bad data)."""
    return finite_number(value)


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation; None when empty."""
    if not sorted_values:
        return None
    if len(sorted_values) == 1:
        return sorted_values[0]
    rank = (len(sorted_values) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (rank - low)


def summary(values: Iterable[float]) -> dict[str, float | int | None]:
    """Count, p50 and p95 of a list of numbers."""
    ordered = sorted(values)
    return {"n": len(ordered), "p50": percentile(ordered, 50), "p95": percentile(ordered, 95)}


def prediction_errors(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per task: n, mean absolute error (s), mean relative error, bias (predicted - actual).

    Only runs that carry both a prediction and a measured run time count. The relative
    error divides by the actual run time, floored at 1 ms so instant tasks do not explode.
    """
    pairs: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in records:
        predicted, actual = number(r.get("predicted_runtime_s")), number(r.get("runtime_s"))
        if predicted is None or actual is None:
            continue
        pairs[str(r.get("task") or "?")].append((predicted, actual))
    out = {}
    for task, items in pairs.items():
        n = len(items)
        out[task] = {
            "n": n,
            "mae_s": sum(abs(p - a) for p, a in items) / n,
            "mre": sum(abs(p - a) / max(a, 1e-3) for p, a in items) / n,
            "bias_s": sum(p - a for p, a in items) / n,
            "mean_predicted_s": sum(p for p, _ in items) / n,
            "mean_actual_s": sum(a for _, a in items) / n,
        }
    return out


def relative_error(record: Mapping[str, Any]) -> float | None:
    """|predicted - actual| / actual of one run (None without both)."""
    predicted, actual = number(record.get("predicted_runtime_s")), number(record.get("runtime_s"))
    if predicted is None or actual is None:
        return None
    return abs(predicted - actual) / max(actual, 1e-3)
