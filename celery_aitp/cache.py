"""The one bounded cache type of the package.

Caches on the publish path hold what is derived from a small, policy-bounded set of
inputs (task names, tenants, predictions); a flood of distinct inputs must not grow them
without end. Starting over when full is enough for that, costs nothing on a hit (``get``
is the plain dict's) and needs no bookkeeping per read, unlike an LRU.
"""

from __future__ import annotations

from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


class BoundedDict(dict[K, V]):
    """A dict that forgets everything when :meth:`put` finds it full."""

    __slots__ = ("limit",)

    def __init__(self, limit: int) -> None:
        super().__init__()
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self.limit = limit

    def put(self, key: K, value: V) -> V:
        """Keep ``value`` under ``key`` (starting over first if full); returns ``value``."""
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
        return value
