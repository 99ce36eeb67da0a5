"""Numbers read back from data anyone may have written (records, headers, the store)."""

from __future__ import annotations

import math
from typing import Any


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
