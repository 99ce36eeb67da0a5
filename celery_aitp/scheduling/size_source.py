"""Live-view source ``sizes``: the fleet's recent effective sizes, and the tier boundaries.

The priority stage appends ``(accelerator, effective size)`` for every task it places to
:attr:`SizeSource.pending` (a deque append). Every ``placement.refresh_s`` the refresher
adds them to one decaying store hash (``sizes``; per size bin the fields
``<accelerator>:<bin>`` (count), ``...:w`` (work) and ``...:i`` (sum of 1/size)) and
reads the whole hash back in the same round trip, so every
producer sees the whole fleet's recent mix and draws the same boundaries from it
(:func:`~celery_aitp.scheduling.size_classes.best_cuts`). The value it publishes, a
:class:`~celery_aitp.scheduling.size_classes.SizeClasses`, is replaced only when some
boundary moves: decisions depend on it as a whole.

The sums decay by tasks placed, not by seconds: their clock is ``_n``, the number of
placements the fleet has added (half-life ``placement.window_tasks``), advanced inside
the store's atomic add, so every producer stamps its batch with the same clock. A time
window would hold a few tasks of a batch system that submits one job every few minutes
(too few to draw boundaries from, ever) and tens of thousands of a busy API; a window of
tasks holds the same recent mix at any rate.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from celery_aitp.priority_policy import PlacementSettings
from celery_aitp.scheduling.size_classes import (
    BIN_COUNT,
    SMALLEST_S,
    Histogram,
    SizeClasses,
    best_cuts,
    classes_used,
    size_bin,
    slowdown_cost,
)
from celery_aitp.store.decayed import DecayedSums, decayed_values, decode_hash
from celery_aitp.store.redis_store import RedisStore, translated_errors

#: The live-view source name (``view.sources``).
SIZES_SOURCE = "sizes"
#: Placements kept for the next batch while the store is unreachable (oldest dropped).
PENDING_LIMIT = 100_000


def sizes_key(store: RedisStore) -> str:
    return store.keys.any("sizes")


def histograms(values: Mapping[str, float]) -> dict[str, Histogram]:
    """Per accelerator class, the decayed histogram (fields it cannot read are ignored:
    anyone who can write the store can write this hash)."""
    found: dict[str, Histogram] = {}
    for name, value in values.items():
        parts = name.rsplit(":", 2)
        kind = parts.pop() if len(parts) == 3 else "n"
        if len(parts) != 2 or kind not in ("n", "w", "i"):
            continue
        accelerator, index = parts
        if not accelerator or not index.isdigit() or not value > 0 or int(index) >= BIN_COUNT:
            continue
        hist = found.setdefault(accelerator, Histogram())
        column = hist.counts if kind == "n" else hist.work if kind == "w" else hist.inverse
        column[int(index)] += value
    return found


#: The hash field counting every placement added: the decay's clock.
CLOCK_FIELD = "_n"


def current_histograms(fields: Mapping[str, str]) -> tuple[dict[str, Histogram], float]:
    """The histograms a ``sizes`` hash holds, decayed to its own clock, and the clock."""
    try:
        clock = float(fields.get(CLOCK_FIELD, 0.0))
    except ValueError:
        clock = 0.0
    return histograms(decayed_values(fields, clock)[0]), clock


def read_sizes(store: RedisStore) -> dict[str, Histogram]:
    """The fleet's size histograms (for the dashboard and explain)."""
    with translated_errors():
        raw = store.client.hgetall(sizes_key(store))
    return current_histograms(decode_hash(raw))[0]


def classes_for(hists: Mapping[str, Histogram], previous: SizeClasses, tiers: int,
                settings: PlacementSettings) -> SizeClasses:
    """Boundaries per accelerator class for these histograms: the best ones, unless the
    previous ones are within ``min_gain`` of them and fill every tier the best ones
    fill (then those stay); ``previous`` itself when nothing moved.

    Cobham's cost does not see an empty tier, so without the second condition a mix
    that moved away from the top tier's sizes kept its old boundaries: the top tier
    empty, the short work one tier lower, where the weighted tier order gives it 8 parts
    of the worker's time to the lowest tier's 1 instead of 64."""
    cuts: dict[str, tuple[int, ...]] = {}
    for accelerator, hist in hists.items():
        if hist.total < settings.min_samples:
            continue
        best = best_cuts(hist, tiers, settings.load, settings.split_gain,
                         settings.min_size_ratio)
        old = previous.cuts.get(accelerator)
        if old is not None and old != best and len(old) == len(best) and \
                classes_used(hist, best) <= classes_used(hist, old):
            kept = slowdown_cost(hist, old, settings.load)
            if slowdown_cost(hist, best, settings.load) > kept * (1.0 - settings.min_gain):
                best = old
        cuts[accelerator] = best
    found = SizeClasses(cuts)
    return previous if found == previous else found


class SizeSource:
    """Ships this process's placements and reads everyone's, every ``refresh_s``."""

    name = SIZES_SOURCE
    initial = SizeClasses()

    def __init__(self, settings: PlacementSettings, tiers: int,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.tiers = tiers
        self.clock = clock
        self.pending: deque[tuple[str, float]] = deque(maxlen=PENDING_LIMIT)
        self._carry: dict[str, float] = {}
        self._last = float("-inf")

    def drain(self) -> dict[str, float]:
        """What was placed since the last round, as hash increments."""
        amounts, self._carry = self._carry, {}
        pending = self.pending
        for _ in range(len(pending)):
            accelerator, seconds = pending.popleft()
            size = max(seconds, SMALLEST_S)
            field = f"{accelerator}:{size_bin(size)}"
            for name, amount in ((field, 1.0), (f"{field}:w", size), (f"{field}:i", 1 / size),
                                 (CLOCK_FIELD, 1.0)):
                amounts[name] = amounts.get(name, 0.0) + amount
        return amounts

    def fetch(self, store: RedisStore, previous: Any) -> SizeClasses:
        now = self.clock()
        # boundaries drawn for another number of tiers (the value a source of another
        # policy left in the view) are dropped and drawn again in this round
        fitted = previous.for_tiers(self.tiers) if isinstance(previous, SizeClasses) \
            else SizeClasses()
        if fitted is previous and now - self._last < self.settings.refresh_s and \
                not self._awaits_boundaries(previous):
            return previous
        self._last = now
        amounts = self.drain()
        try:
            with translated_errors():
                pipe = store.client.pipeline(transaction=False)
                if amounts:
                    DecayedSums(store).add(pipe, sizes_key(store), amounts, 0.0,
                                           self.settings.window_tasks, clock_field=CLOCK_FIELD)
                pipe.hgetall(sizes_key(store))
                raw = pipe.execute()[-1]
        except Exception:
            self._carry = amounts  # sent with the next round (a sum: bounded in size)
            raise
        hists = current_histograms(decode_hash(raw))[0]
        return classes_for(hists, fitted, self.tiers, self.settings)

    def _awaits_boundaries(self, previous: Any) -> bool:
        """Whether this process's newest placement is of a class without boundaries.

        Until it has some, every task of the class takes the lowest tier and then waits
        there behind the short work placed once the boundaries exist (placement
        benchmark, pareto, the first model's first seconds: short tasks waited up to
        3.8 s); so such a class is read back every refresher round, not every
        ``refresh_s``."""
        try:
            family = self.pending[-1][0]  # one atomic read: the publish path appends
        except IndexError:
            return False
        cuts = previous.cuts if isinstance(previous, SizeClasses) else {}
        return family not in cuts
