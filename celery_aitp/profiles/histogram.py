"""Exponential buckets for decaying histograms (as in Kubernetes' VPA recommender).

Bucket ``i`` holds values in ``(first * g**(i-1), first * g**i]`` with growth ``g`` = 1.05,
so a percentile read off the histogram overestimates by at most 5%, never underestimates;
bucket 0 holds everything at or below ``first``. Only non-empty buckets are stored, so a
stable task costs a handful of hash fields.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

GROWTH = 1.05
_LOG_GROWTH = math.log(GROWTH)
#: Largest bucket index: 1 ms * 1.05**700 is about 7e11 s; anything beyond is clamped.
MAX_BUCKET = 700


def bucket_of(value: float, first: float) -> int:
    """The bucket index of ``value`` (>= 0)."""
    if not value > first:  # also catches NaN
        return 0
    return min(MAX_BUCKET, math.ceil(math.log(value / first) / _LOG_GROWTH - 1e-9))


def bucket_upper(index: int, first: float) -> float:
    """The upper bound of bucket ``index``."""
    return first * GROWTH ** index


def percentile(weights: Mapping[int, float], q: float, first: float) -> float | None:
    """The ``q``-quantile (0 < q < 1) of a bucketed distribution; None when empty."""
    total = sum(w for w in weights.values() if w > 0)
    if total <= 0:
        return None
    threshold = q * total
    running = 0.0
    last = 0
    for index in sorted(weights):
        w = weights[index]
        if w <= 0:
            continue
        running += w
        last = index
        if running >= threshold - 1e-12 * total:
            return bucket_upper(index, first)
    return bucket_upper(last, first)
