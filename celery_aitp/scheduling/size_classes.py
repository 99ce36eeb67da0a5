"""Tiers as size classes: where the boundaries between tiers go, from recent work.

A worker reads its tiers highest first, so each tier behaves like one class of a
non-preemptive priority queue. Putting short work in the top tier approximates shortest
job first, which is what cuts mean slowdown (a task's wait over its runtime); the
question is only where the boundaries between the classes go. They are chosen from the
recent histogram of *effective sizes* (predicted runtime over an urgency weight, see
``publish/priority_stage.py``) of each accelerator class, to minimise the mean slowdown
that Cobham's formula for non-preemptive priority classes predicts::

    E[wait of class i] = W0 / ((1 - rho * s(i-1)) * (1 - rho * s(i)))

where ``s(i)`` is the share of all work in classes 1..i and ``W0`` the mean residual
work (the same for every choice, so left out). The mean slowdown is then proportional to

    sum_i  P(class i) * E[1 / size | class i] / ((1 - rho * s(i-1)) * (1 - rho * s(i)))

which a dynamic programme over the histogram's bins minimises exactly. ``rho`` is the
load the boundaries are tuned for: a heavy one, because at light load every class waits
little whatever the boundaries. On a bimodal mix this finds the gap between the modes;
on a heavy-tailed one it gives the short majority the top tiers and the few huge tasks
the lowest.

Sizes are binned on a log scale (two bins per doubling from 1 ms); each bin keeps the
count, the work and the sum of 1/size of its sizes, so the cost is exact for any split
at bin edges (a mix of near-equal sizes that happens to straddle an edge does not look
splittable). Boundaries are bin edges: they move only when the optimum moves by a whole
bin, and then only if the new ones are clearly better (``min_gain``), so a steady mix
gives steady tiers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

#: Smallest size a bin tells apart (seconds); anything shorter is in bin 0.
SMALLEST_S = 0.001
#: Bins per doubling of the size.
BINS_PER_DOUBLING = 2
#: Number of bins: from 1 ms to about 2 ** 28 ms (3 days); longer is in the last bin.
BIN_COUNT = 56
#: How much better (relative mean slowdown) one more group must make the split, by
#: default (``placement.split_gain``).
SPLIT_GAIN = 0.2
#: How many times longer, on average, a group's tasks must run than the group above's,
#: by default (``placement.min_size_ratio``): 1, any split.
MIN_SIZE_RATIO = 1.0
#: Share of the recent tasks a class must hold to count as filled (a decayed histogram
#: never empties a bin: a class of yesterday's mix keeps a trace of it).
FILLED_SHARE = 0.01


def size_bin(seconds: float) -> int:
    """The histogram bin of a size in seconds (0 for anything at or below 1 ms)."""
    if not seconds > SMALLEST_S:  # also NaN
        return 0
    found = int(math.log2(seconds / SMALLEST_S) * BINS_PER_DOUBLING)
    return found if found < BIN_COUNT else BIN_COUNT - 1


def bin_lower_s(index: int) -> float:
    """The size (seconds) at the lower edge of bin ``index``: a boundary at ``index``."""
    return SMALLEST_S * 2.0 ** (index / BINS_PER_DOUBLING)


@dataclass
class Histogram:
    """Per size bin: how many sizes, their sum (the work) and the sum of 1/size."""

    counts: list[float] = field(default_factory=lambda: [0.0] * BIN_COUNT)
    work: list[float] = field(default_factory=lambda: [0.0] * BIN_COUNT)
    inverse: list[float] = field(default_factory=lambda: [0.0] * BIN_COUNT)

    def add(self, seconds: float, n: float = 1.0) -> None:
        b = size_bin(seconds)
        size = max(seconds, SMALLEST_S)
        self.counts[b] += n
        self.work[b] += n * size
        self.inverse[b] += n / size

    @classmethod
    def of(cls, sizes: Iterable[float]) -> Histogram:
        found = cls()
        for size in sizes:
            found.add(size)
        return found

    @property
    def total(self) -> float:
        return sum(self.counts)


class _Prefix:
    """Prefix sums of a histogram, for the cost of any run of bins in O(1)."""

    def __init__(self, hist: Histogram) -> None:
        self.n, self.w, self.i = [0.0], [0.0], [0.0]
        for count, work, inverse in zip(hist.counts, hist.work, hist.inverse, strict=True):
            self.n.append(self.n[-1] + count)
            self.w.append(self.w[-1] + work)
            self.i.append(self.i[-1] + inverse)
        self.total, self.all_work = self.n[-1], self.w[-1]

    def cost(self, start: int, end: int, rho: float) -> float:
        """One class holding bins ``start`` up to, not including, ``end``."""
        if self.n[end] - self.n[start] <= 0:
            return 0.0
        inverse = (self.i[end] - self.i[start]) / self.total
        return inverse / ((1 - rho * self.w[start] / self.all_work)
                          * (1 - rho * self.w[end] / self.all_work))


def slowdown_cost(hist: Histogram, cuts: Sequence[int], rho: float) -> float:
    """Cobham's relative mean slowdown (module docstring) of the classes that ``cuts``
    make of ``hist``: class ``i`` holds the bins from ``cuts[i-1]`` (0 for the first) up
    to, not including, ``cuts[i]`` (the last class: to the end)."""
    prefix = _Prefix(hist)
    if prefix.total <= 0 or prefix.all_work <= 0:
        return 0.0
    edges = [0, *cuts, BIN_COUNT]
    return sum(prefix.cost(a, b, rho) for a, b in zip(edges, edges[1:], strict=False))


def classes_used(hist: Histogram, cuts: Sequence[int]) -> frozenset[int]:
    """Which of the classes ``cuts`` make of ``hist`` (0: the top one) hold at least
    :data:`FILLED_SHARE` of its tasks."""
    total = hist.total
    if total <= 0:
        return frozenset()
    edges = [0, *cuts, BIN_COUNT]
    return frozenset(k for k, (a, b) in enumerate(zip(edges, edges[1:], strict=False))
                     if sum(hist.counts[a:b]) >= FILLED_SHARE * total)


def best_cuts(hist: Histogram, classes: int, rho: float, split_gain: float = SPLIT_GAIN,
              min_size_ratio: float = MIN_SIZE_RATIO) -> tuple[int, ...]:
    """The ``classes - 1`` bin indices that split ``hist`` into classes with the least
    :func:`slowdown_cost` (non-decreasing; equal ones leave a class empty): for each
    number of groups the cheapest split, kept only if each of its groups runs at least
    ``min_size_ratio`` times longer on average than the group above.

    A boundary must earn its place: the fewest groups whose cost is within
    ``split_gain`` of the best are used, because a split that barely helps the mean
    still makes the longest tasks of the lower group wait behind the rest (how much
    they wait depends on the tier weights: see ``placement.split_gain`` in
    docs/configuration.md). With fewer groups than classes, the shortest group takes
    the top class, the longest the lowest, and the classes left empty are the ones in
    between; a mix with nothing to tell apart lands in the lowest class, as tasks do
    when nothing is known."""
    if classes <= 1:
        return ()
    prefix = _Prefix(hist)
    if prefix.total <= 0 or prefix.all_work <= 0:
        return (BIN_COUNT,) * (classes - 1)
    found = [(cost, starts) for cost, starts in
             (_groups(prefix, m, rho) for m in range(1, classes + 1))
             if _apart(prefix, starts, min_size_ratio)]  # one group always qualifies
    least = min(cost for cost, _ in found)
    starts = next(starts for cost, starts in found if cost <= least * (1.0 + split_gain))
    middle = starts[1:-1]
    return (*middle, *[starts[-1]] * (classes - 1 - len(middle)))


def _apart(prefix: _Prefix, starts: list[int], min_size_ratio: float) -> bool:
    """Whether each group from ``starts`` runs ``min_size_ratio`` times the one before
    it, in mean size."""
    edges = [*starts, BIN_COUNT]
    means = [(prefix.w[b] - prefix.w[a]) / (prefix.n[b] - prefix.n[a])
             for a, b in zip(edges, edges[1:], strict=False)]
    return all(later >= min_size_ratio * earlier
               for earlier, later in zip(means, means[1:], strict=False))


def _groups(prefix: _Prefix, classes: int, rho: float) -> tuple[float, list[int]]:
    """(least cost, the non-empty groups' first bins) of splitting the histogram into
    at most ``classes`` groups: a dynamic programme over the bin edges."""
    n = BIN_COUNT
    # best[e]: least cost of the groups so far ending at edge e; how[k][e]: its start
    best = [prefix.cost(0, e, rho) for e in range(n + 1)]
    how: list[list[int]] = []
    for _ in range(classes - 2):
        nxt: list[float] = []
        choice: list[int] = []
        for end in range(n + 1):
            start = _argmin([best[s] + prefix.cost(s, end, rho) for s in range(end + 1)])
            nxt.append(best[start] + prefix.cost(start, end, rho))
            choice.append(start)
        best = nxt
        how.append(choice)
    if classes == 1:
        cost, cuts = best[n], []
    else:
        last = _argmin([best[s] + prefix.cost(s, n, rho) for s in range(n + 1)])
        cost, cuts = best[last] + prefix.cost(last, n, rho), [last]
        for choice in reversed(how):
            cuts.append(choice[cuts[-1]])
    edges = [0, *reversed(cuts), n]
    return cost, [a for a, b in zip(edges, edges[1:], strict=False)
                  if prefix.n[b] > prefix.n[a]]


def _argmin(values: list[float]) -> int:
    """The index of the least value (the first of equal ones)."""
    return min(range(len(values)), key=values.__getitem__)


class SizeClasses:
    """Tier boundaries per accelerator class (upper edges in seconds, highest tier first),
    and the rank a size gets. Immutable: a new one is made when the boundaries move."""

    __slots__ = ("bounds", "cuts")

    def __init__(self, cuts: Mapping[str, tuple[int, ...]] | None = None) -> None:
        self.cuts: dict[str, tuple[int, ...]] = dict(cuts or {})
        self.bounds: dict[str, tuple[float, ...]] = {
            accelerator: tuple(bin_lower_s(cut) for cut in found)
            for accelerator, found in self.cuts.items()}

    def rank(self, accelerator: str, size_s: float | None, unknown: int) -> int:
        """The tier rank (0: highest) of an effective size on ``accelerator``; ``unknown``
        when nothing is known yet (no size, or no boundaries for the class)."""
        bounds = self.bounds.get(accelerator)
        if bounds is None or size_s is None or not size_s >= 0:
            return unknown
        rank = 0
        for bound in bounds:
            if size_s < bound:
                break
            rank += 1
        return rank

    def for_tiers(self, tiers: int) -> SizeClasses:
        """The boundaries made for ``tiers`` tiers (``tiers - 1`` of them per class): a
        class whose boundaries were drawn for another number of tiers (by a source of a
        policy with other tiers) is left out, as if it had none yet, since its ranks
        could name a tier this policy does not have. ``self`` when every class fits."""
        fitting = {accelerator: cuts for accelerator, cuts in self.cuts.items()
                   if len(cuts) == tiers - 1}
        return self if len(fitting) == len(self.cuts) else SizeClasses(fitting)

    def as_dict(self) -> dict[str, list[float]]:
        """Boundaries in seconds per accelerator class (for explain and the dashboard)."""
        return {accelerator: list(bounds) for accelerator, bounds in self.bounds.items()}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SizeClasses) and other.cuts == self.cuts

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.cuts.items())))
