"""Live-view source ``spill``: which tier queues are saturated, and whether standard
workers could take the overflow.

Every worker (flagged or not) writes an occupancy report to the store hash
``occupancy`` every ``spill.report_interval_s`` (:mod:`celery_aitp.worker.occupancy`):
its slots, how many are busy, its accelerator class, whether it consumes Celery's
default queue, the tier queues it serves and their depths on the broker. The producer's
refresher reads the whole hash with the store server's time in one round trip
(:class:`SpillSource`, never on the publish path; reports are stamped with that clock,
and those an hour old, of workers killed without withdrawing theirs, are deleted) and
turns it into a :class:`Capacity`:

* per tier queue, the *backlog per slot*: waiting tasks / pool slots serving it. A
  queue starts spilling when it reaches ``spill.min_backlog`` and stops only once it
  falls to ``release * min_backlog`` (hysteresis: a backlog hovering at the threshold
  does not turn spilling on and off every second);
* the accelerator class the standard workers provide, if they all provide the same one
  and together have at least ``spill.min_idle_slots`` idle slots (else nothing spills
  there: a task sent to the default queue could land on a worker that cannot run it);
* the *open* tier queues: empty, with a serving worker that has an idle slot (where a
  task of another class may go, by ``spill.alternatives``).

The spill stage (:mod:`celery_aitp.publish.spill_stage`) decides per task from it. The
value is replaced only when it changes, so the decision memo keeps its decisions while
nothing is saturated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from celery_aitp.priority_policy import SpillSettings
from celery_aitp.queues import is_tier_queue
from celery_aitp.store.redis_store import RedisStore

#: The live-view source name (``view.sources``).
SPILL_SOURCE = "spill"
#: Backlogs are kept to this many decimals, so small wobbles do not replace the value.
BACKLOG_DECIMALS = 1


def occupancy_key(store: RedisStore) -> str:
    """HASH worker -> JSON occupancy report."""
    return store.keys.any("occupancy")


class Capacity:
    """Saturated tier queues (backlog per slot) and the standard workers' class with idle
    slots (None: nothing may spill). Immutable; compared by value."""

    __slots__ = ("backlog", "spill_class", "idle_slots", "open_queues")

    def __init__(self, backlog: Mapping[str, float] | None = None,
                 spill_class: str | None = None, idle_slots: int = 0,
                 open_queues: Iterable[str] = ()) -> None:
        self.backlog: dict[str, float] = dict(backlog or {})
        self.spill_class = spill_class
        self.idle_slots = idle_slots
        self.open_queues = frozenset(open_queues)

    def _key(self) -> tuple[Any, ...]:
        return (self.backlog, self.spill_class, self.idle_slots, self.open_queues)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Capacity) and other._key() == self._key()

    def __hash__(self) -> int:
        return hash((tuple(sorted(self.backlog.items())), self.spill_class, self.idle_slots,
                     self.open_queues))

    def __repr__(self) -> str:
        return (f"Capacity(backlog={self.backlog!r}, spill_class={self.spill_class!r}, "
                f"idle_slots={self.idle_slots}, open_queues={sorted(self.open_queues)!r})")

    def as_dict(self) -> dict[str, Any]:
        return {"backlog_per_slot": dict(self.backlog), "spill_class": self.spill_class,
                "idle_slots": self.idle_slots, "open_queues": sorted(self.open_queues)}


NO_CAPACITY = Capacity()


def _count(value: Any) -> int | None:
    """A non-negative integer count, or None (anyone who can write the store can write
    this hash)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not 0 <= value < 1e9:  # also drops NaN
        return None
    return int(value)


class _Tally:
    """What the fresh reports add up to: slots and depth per tier queue, idle slots and
    accelerator classes of the default queue's consumers."""

    def __init__(self) -> None:
        self.slots: dict[str, int] = {}
        self.free: dict[str, int] = {}  # idle slots of the workers serving each queue
        self.depth: dict[str, int] = {}
        self.idle = 0
        self.classes: set[str] = set()

    def add(self, report: Any, now: float, max_age_s: float) -> None:
        if not isinstance(report, dict):
            return
        at, n = report.get("at"), _count(report.get("slots"))
        if not isinstance(at, (int, float)) or not now - at <= max_age_s or not n:
            return
        idle = n - min(n, _count(report.get("busy")) or 0)
        queues = report.get("queues")
        for queue in queues if isinstance(queues, list) else ():
            if isinstance(queue, str) and is_tier_queue(queue):
                self.slots[queue] = self.slots.get(queue, 0) + n
                self.free[queue] = self.free.get(queue, 0) + idle
        depths = report.get("depths")
        for queue, d in (depths.items() if isinstance(depths, dict) else ()):
            count = _count(d)
            if count is not None and is_tier_queue(queue):
                self.depth[queue] = max(self.depth.get(queue, 0), count)
        if report.get("default_queue") is True:
            accelerator = report.get("accelerator")
            self.classes.add(accelerator if isinstance(accelerator, str) else "")
            self.idle += idle


def capacity_of(reports: Iterable[Any], now: float, settings: SpillSettings,
                previous: Capacity = NO_CAPACITY) -> Capacity:
    """The capacity the fresh ``reports`` describe; ``previous`` itself if nothing changed
    (its spilling queues are what the hysteresis starts from)."""
    tally = _Tally()
    for report in reports:
        tally.add(report, now, settings.max_report_age_s)
    backlog: dict[str, float] = {}
    start, stop = settings.min_backlog, settings.min_backlog * settings.release
    for queue, waiting in tally.depth.items():
        serving = tally.slots.get(queue)
        if not serving:
            continue  # nobody serves it: the route stage falls back (no_live_worker)
        per_slot = waiting / serving
        if per_slot >= start or (queue in previous.backlog and per_slot > stop):
            backlog[queue] = round(per_slot, BACKLOG_DECIMALS)
    spill_class = None
    if len(tally.classes) == 1 and tally.idle >= settings.min_idle_slots:
        spill_class = next(iter(tally.classes)) or None
    # idle slots matter only while something spills: no churn (nor memo resets) without
    open_queues = [q for q, free in tally.free.items() if free and not tally.depth.get(q)]
    found = Capacity(backlog, spill_class, tally.idle if spill_class is not None else 0,
                     open_queues) if backlog else NO_CAPACITY
    return previous if found == previous else found


def read_capacity(store: RedisStore, settings: SpillSettings,
                  previous: Capacity = NO_CAPACITY, now: float | None = None) -> Capacity:
    """The fleet's capacity from the store (one round trip). Reports are judged by the
    store server's time, which stamps them (``now``: a simulated time instead); those
    of workers gone for an hour (killed without withdrawing theirs) are deleted."""
    server_now, reports = store.read_stamped(occupancy_key(store), "at")
    return capacity_of(reports, server_now if now is None else now, settings, previous)


class SpillSource:
    """Reads the workers' occupancy reports once per live-view refresh."""

    name = SPILL_SOURCE
    initial = NO_CAPACITY

    def __init__(self, settings: SpillSettings,
                 clock: Callable[[], float] | None = None) -> None:
        """``clock``: a simulated time (a replay); None judges reports by the store
        server's time, the one they are stamped with."""
        self.settings = settings
        self.clock = clock

    def fetch(self, store: RedisStore, previous: Any) -> Capacity:
        last = previous if isinstance(previous, Capacity) else NO_CAPACITY
        return read_capacity(store, self.settings, last,
                             None if self.clock is None else self.clock())
