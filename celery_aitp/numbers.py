"""Numbers read back from data anyone may have written (records, headers, the store)."""

from __future__ import annotations

import json
import math
from typing import Any

#: Compact JSON of any value (``str()`` of what JSON cannot hold), for records and headers.
compact_json = json.JSONEncoder(default=str, separators=(",", ":")).encode


def finite_number(value: Any) -> float | None:
    """``value`` as a finite float, or None: not a number, a bool, NaN, infinite, or an
    int too large for a float. Never raises."""
    if type(value) is float:
        return value if value - value == 0.0 else None  # 0.0 only when finite
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        return None
    return number if math.isfinite(number) else None


#: A run's queue wait (its start on the worker's clock minus its decision on the
#: producer's) below minus this is clock skew, not a wait: unknown, neither an SLA hit
#: nor a miss (counted ``clock_skew``). Within it, small negatives of synced clocks.
CLOCK_SKEW_TOLERANCE_S = 1.0


def skewed_wait(wait: float) -> bool:
    """Whether a recorded queue wait is too negative to be anything but clock skew."""
    return wait < -CLOCK_SKEW_TOLERANCE_S


def json_number(value: Any) -> str:
    """A number as record JSON, without the general encoder for the common cases: a
    finite float's repr, ``null`` for None, NaN and infinities; anything else as
    ``json`` encodes it."""
    if type(value) is float:
        return repr(value) if value - value == 0.0 else "null"  # 0.0 only when finite
    return "null" if value is None else compact_json(value)
