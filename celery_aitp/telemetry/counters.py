"""Process-local counters, drained into the shared store by the background refresher.

Incrementing is one plain dict update under a lock (a ``Counter``'s ``+=`` costs twice
as much: its subscripts skip the dict fast path); nothing here does I/O, so counting on
the publish path is free of network round trips. The hottest count (a reused decision's)
takes no lock at all: a *tally* is a list that grows by one item per event (one
``list.append`` is atomic), and ``drain`` and ``totals`` read its length; the refresher
drains every second, so a tally holds at most one interval's events. The running totals
of this process are only summed when someone reads them (status, the demo, tests), not
on every increment.
"""

from __future__ import annotations

import threading
from collections import Counter


class Counters:
    """Named event counts since the last drain, plus running totals for this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}
        self._drained: Counter[str] = Counter()  # everything handed out by drain()
        self._tallies: dict[str, list[None]] = {}

    def incr(self, name: str, n: int = 1) -> None:
        with self._lock:
            pending = self._pending
            pending[name] = pending.get(name, 0) + n

    def tally(self, name: str) -> list[None]:
        """The tally of ``name``: count one event by appending None to it, with no lock
        (the same list for the same name, until the process ends)."""
        found = self._tallies.get(name)  # one dict read is atomic: no lock once made
        if found is None:
            with self._lock:
                found = self._tallies.setdefault(name, [])
        return found

    @property
    def totals(self) -> Counter[str]:
        """Every count of this process so far (a copy), shipped or not."""
        with self._lock:
            totals = self._drained.copy()
            totals.update(self._pending)
            for name, marks in self._tallies.items():
                if marks:
                    totals[name] += len(marks)
        return totals

    def drain(self) -> dict[str, int]:
        """Counts since the last drain (the caller ships them somewhere)."""
        with self._lock:
            pending, self._pending = self._pending, {}
            for name, marks in self._tallies.items():
                n = len(marks)
                if n:
                    del marks[:n]  # one call: appends made meanwhile stay for the next
                    pending[name] = pending.get(name, 0) + n
            self._drained.update(pending)
        return pending

    def restore(self, counts: dict[str, int]) -> None:
        """Put back counts that could not be shipped, so none are lost."""
        with self._lock:
            pending = self._pending
            for name, n in counts.items():
                pending[name] = pending.get(name, 0) + n
            self._drained.subtract(counts)
