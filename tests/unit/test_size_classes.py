"""Tiers as size classes: the boundaries, and the fleet-wide histogram they come from."""

from __future__ import annotations

import random

import pytest

from celery_aitp.priority_policy import PlacementSettings
from celery_aitp.scheduling.size_classes import (
    BIN_COUNT,
    MIN_SIZE_RATIO,
    Histogram,
    SizeClasses,
    best_cuts,
    bin_lower_s,
    classes_used,
    size_bin,
    slowdown_cost,
)
from celery_aitp.scheduling.size_source import SizeSource, classes_for, read_sizes, sizes_key


def histogram(sizes: list[float]) -> Histogram:
    return Histogram.of(sizes)


def bimodal(n: int, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    return [rng.uniform(0.01, 0.05) if rng.random() < 0.8 else rng.uniform(0.5, 1.5)
            for _ in range(n)]


def classes_of(sizes: list[float], cuts: tuple[int, ...]) -> list[int]:
    return [SizeClasses({"cpu": cuts}).rank("cpu", s, -1) for s in sizes]


def test_bins_grow_with_the_size_and_clamp_at_both_ends():
    assert size_bin(0.0) == size_bin(-1.0) == size_bin(float("nan")) == 0
    assert size_bin(1e12) == BIN_COUNT - 1
    sizes = [0.002 * 1.3 ** i for i in range(60)]
    assert [size_bin(s) for s in sizes] == sorted(size_bin(s) for s in sizes)
    assert bin_lower_s(size_bin(0.3)) <= 0.3 < bin_lower_s(size_bin(0.3) + 1)


def test_a_bimodal_mix_is_split_at_its_gap():
    sizes = bimodal(4000)
    cuts = best_cuts(histogram(sizes), 3, 0.95)
    ranks = classes_of(sizes, cuts)
    short = {r for s, r in zip(sizes, ranks, strict=True) if s < 0.1}
    long = {r for s, r in zip(sizes, ranks, strict=True) if s > 0.4}
    assert max(short) < min(long)  # every short task ahead of every long one
    assert slowdown_cost(histogram(sizes), cuts, 0.95) < \
        0.2 * slowdown_cost(histogram(sizes), (BIN_COUNT, BIN_COUNT), 0.95)  # vs one class


def test_a_heavy_tail_gives_the_short_majority_the_top_tier():
    rng = random.Random(3)
    sizes = [0.01 * rng.paretovariate(1.2) for _ in range(5000)]
    ranks = classes_of(sizes, best_cuts(histogram(sizes), 3, 0.95))
    assert ranks.count(0) > 0.5 * len(sizes) and ranks.count(2) < 0.1 * len(sizes)


def test_a_mix_with_nothing_to_tell_apart_takes_the_lowest_class():
    assert best_cuts(histogram([0.5] * 100), 3, 0.95) == (0, 0)
    assert classes_of([0.5], (0, 0)) == [2]
    assert best_cuts(Histogram(), 3, 0.95) == (BIN_COUNT, BIN_COUNT)
    assert best_cuts(histogram([0.5, 5.0]), 1, 0.95) == ()


@pytest.mark.parametrize("low, high", [(0.45, 0.55), (0.17, 0.21), (0.9, 1.1)])
def test_near_equal_sizes_that_straddle_a_bin_edge_are_not_split(low, high):
    """Each bin keeps its sizes' exact work and 1/size, so a narrow mix that crosses a
    bin edge does not look like two sizes (bin centres are a factor 1.41 apart)."""
    rng = random.Random(5)
    sizes = [rng.uniform(low, high) for _ in range(2000)]
    assert len({size_bin(s) for s in sizes}) == 2
    assert classes_of(sizes, best_cuts(histogram(sizes), 3, 0.95)) == [2] * len(sizes)


def test_near_equal_groups_are_one_class_with_a_size_ratio_even_when_every_gain_counts():
    """Splitting a narrow mix would lower Cobham's cost (by about 10%); with
    ``split_gain`` 0 what keeps it whole is a size ratio its halves' mean sizes do not
    reach. The default ratio (1) allows any split."""
    rng = random.Random(5)
    hist = histogram([rng.uniform(0.45, 0.55) for _ in range(2000)])
    assert MIN_SIZE_RATIO == 1.0
    assert best_cuts(hist, 3, 0.95, split_gain=0.0) != (0, 0)
    assert best_cuts(hist, 3, 0.95, split_gain=0.0, min_size_ratio=2.0) == (0, 0)


def test_a_split_gain_of_zero_uses_every_class_that_lowers_the_cost():
    """A batch log's sizes span seconds to hours: a third class lowers the cost by a few
    percent, which the default gain (20%) does not draw and ``split_gain`` 0 does; with
    a size ratio of 2 each class runs at least twice as long as the one above."""
    rng = random.Random(2)
    sizes = [rng.lognormvariate(5, 2.5) for _ in range(5000)]
    hist = histogram(sizes)
    assert len(set(classes_of(sizes, best_cuts(hist, 3, 0.95)))) == 2
    cuts = best_cuts(hist, 3, 0.95, split_gain=0.0, min_size_ratio=2.0)
    ranks = classes_of(sizes, cuts)
    assert set(ranks) == {0, 1, 2}
    means = [sum(s for s, r in zip(sizes, ranks, strict=True) if r == k) / ranks.count(k)
             for k in range(3)]
    assert means[1] >= 2 * means[0] and means[2] >= 2 * means[1]
    assert slowdown_cost(hist, cuts, 0.95) < slowdown_cost(hist, (cuts[1], cuts[1]), 0.95)


def test_the_policys_split_gain_and_size_ratio_reach_the_boundaries():
    rng = random.Random(2)
    wide = {"cpu": histogram([rng.lognormvariate(5, 2.5) for _ in range(2000)])}
    narrow = {"cpu": histogram([rng.uniform(0.45, 0.55) for _ in range(2000)])}

    def cuts(hists, **settings):
        found = classes_for(hists, SizeClasses(), 3, PlacementSettings(min_samples=10,
                                                                       **settings))
        return found.cuts["cpu"]

    assert len(set(cuts(wide))) == 1 and len(set(cuts(wide, split_gain=0.0))) == 2
    assert cuts(narrow, split_gain=0.0) != (0, 0)
    assert cuts(narrow, split_gain=0.0, min_size_ratio=2.0) == (0, 0)


def test_boundaries_stay_unless_new_ones_are_clearly_better():
    settings = PlacementSettings(min_gain=0.05, min_samples=10)
    sizes = bimodal(4000)
    first = classes_for({"cpu": histogram(sizes)}, SizeClasses(), 3, settings)
    again = classes_for({"cpu": histogram(bimodal(4000, seed=2))}, first, 3, settings)
    assert again is first  # the same mix, sampled again: no move
    shifted = classes_for({"cpu": histogram([s * 20 for s in sizes])}, first, 3, settings)
    assert shifted != first and shifted.bounds["cpu"][0] > first.bounds["cpu"][0]
    few = classes_for({"cpu": histogram(sizes[:5])}, SizeClasses(), 3, settings)
    assert few.cuts == {}  # too few samples: no boundaries, the lowest tier for all


def test_boundaries_that_leave_the_top_tier_empty_move_even_without_a_gain():
    """Cobham's cost does not see an empty tier: a mix that moved away from the top
    tier's sizes would keep the old boundaries, its short work one tier lower. They
    move when the best ones fill a tier they leave empty, and only then: boundaries
    that fill more tiers than the best stay while within ``min_gain``."""
    settings = PlacementSettings(min_samples=10)
    hist = histogram([s * 10 for s in bimodal(4000)])  # 0.1-0.5 s and 5-15 s
    best = best_cuts(hist, 3, settings.load)
    stale = SizeClasses({"cpu": (size_bin(0.02), best[-1])})  # a top tier for 20 ms tasks
    assert 0 not in classes_used(hist, stale.cuts["cpu"]) and 0 in classes_used(hist, best)
    assert slowdown_cost(hist, best, settings.load) > \
        slowdown_cost(hist, stale.cuts["cpu"], settings.load) * (1 - settings.min_gain)
    moved = classes_for({"cpu": hist}, stale, 3, settings)
    assert moved.cuts["cpu"] == best
    assert moved.rank("cpu", 0.3, 2) == 0  # the short work is back in the top tier
    fuller = SizeClasses({"cpu": (size_bin(0.25), best[-1])})  # splits the short mode
    assert classes_used(hist, best) < classes_used(hist, fuller.cuts["cpu"])
    kept = slowdown_cost(hist, fuller.cuts["cpu"], settings.load)
    assert slowdown_cost(hist, best, settings.load) > kept * (1 - settings.min_gain)
    assert classes_for({"cpu": hist}, fuller, 3, settings) is fuller
    assert classes_used(Histogram(), best) == frozenset()  # nothing recent: none filled


def test_every_producer_sees_the_whole_fleets_mix(store):
    settings = PlacementSettings(refresh_s=0.001, min_samples=10, window_tasks=1e6)
    clock = iter(float(t) for t in range(1000, 2000)).__next__
    a, b = SizeSource(settings, 3, clock), SizeSource(settings, 3, clock)
    a.pending.extend(("cpu", s) for s in bimodal(500) if s < 0.1)  # short only
    b.pending.extend(("cpu", s) for s in bimodal(500) if s > 0.1)  # long only
    first = a.fetch(store, SizeClasses())  # only its own short tasks so far
    both = b.fetch(store, SizeClasses())
    assert "cpu" in both.cuts and first != both
    assert a.fetch(store, first) == both  # now a sees b's long tasks too
    hist = read_sizes(store)["cpu"]
    assert hist.total == pytest.approx(500, rel=0.05)
    assert sum(hist.work) == pytest.approx(sum(bimodal(500)), rel=0.05)


def test_the_window_counts_tasks_not_seconds(store):
    """One task an hour still forms boundaries; a changed mix takes over after about a
    window of tasks, however long that took."""
    settings = PlacementSettings(refresh_s=0.001, min_samples=20, window_tasks=100)
    hours = iter(float(3600 * t) for t in range(1, 100_000)).__next__
    source = SizeSource(settings, 3, hours)
    classes = SizeClasses()
    for size in bimodal(60):  # one task per round, an hour apart
        source.pending.append(("cpu", size))
        classes = source.fetch(store, classes)
    assert "cpu" in classes.cuts  # a time window of minutes would hold ~nothing
    hist = read_sizes(store)["cpu"]
    assert 40 < hist.total <= 60  # 60 tasks, the oldest worth 2 ** (-60 / 100)
    for size in bimodal(600, seed=2):  # the same mix, ten times longer
        source.pending.append(("cpu", size * 10))
        classes = source.fetch(store, classes)
    assert classes.bounds["cpu"][0] > 0.1  # the boundary followed the new mix
    hist = read_sizes(store)["cpu"]
    old_share = sum(hist.counts[: size_bin(0.06)]) / hist.total
    assert old_share < 0.03  # 600 tasks = 6 half-lives: the old mix is about gone


def test_two_producers_stamp_their_batches_with_one_clock(store):
    settings = PlacementSettings(refresh_s=0.001, window_tasks=100)
    clock = iter(float(t) for t in range(1000, 2000)).__next__
    a, b = SizeSource(settings, 3, clock), SizeSource(settings, 3, clock)
    a.pending.extend(("cpu", 0.02) for _ in range(1000))
    a.fetch(store, SizeClasses())
    b.pending.extend(("cpu", 1.0) for _ in range(10))  # b's first batch, after a's 1,000
    b.fetch(store, SizeClasses())
    hist = read_sizes(store)["cpu"]
    assert hist.counts[size_bin(1.0)] == pytest.approx(10)  # not lost as "long ago"
    assert hist.counts[size_bin(0.02)] == pytest.approx(1000 * 2 ** (-10 / 100))


def test_junk_in_the_shared_hash_is_ignored(store):
    store.client.hset(sizes_key(store), mapping={
        "_ref": "1000", "_hl": "120", "_n": "1000", "cpu:3": "5", "cpu:3:w": "0.01", "cpu:x": "9",
        "cpu:999": "7", ":4": "2", "gpu:2": "nan", "cpu:4": "-3", "cpu:3:q": "1",
        "a:b:c:d": "1"})
    found = read_sizes(store)
    assert list(found) == ["cpu"] and found["cpu"].total == 5.0
    assert found["cpu"].work[3] == 0.01 and sum(found["cpu"].inverse) == 0


def _one_by_one(store, source: SizeSource, sizes: list[float], every_s: float,
                start: float = 1000.0) -> list[SizeClasses]:
    """``sizes`` placed one per ``every_s`` seconds, a refresh after each."""
    now, found, seen = start, SizeClasses(), []
    for size in sizes:
        source.clock = lambda t=now: t
        source.pending.append(("cpu", size))
        found = source.fetch(store, found)
        seen.append(found)
        now += every_s
    return seen


def test_rare_tasks_still_draw_boundaries(store):
    # batch jobs: one every 10 minutes, min_samples 20; a half-life of seconds would keep
    # the decayed count below one and every task in lo
    settings = PlacementSettings(refresh_s=0.001)
    source = SizeSource(settings, 3)
    seen = _one_by_one(store, source, bimodal(200, seed=4), every_s=600.0)
    assert "cpu" in seen[-1].cuts
    short, long = 0.03, 1.0
    assert seen[-1].rank("cpu", short, 2) < seen[-1].rank("cpu", long, 2)


def test_a_class_without_boundaries_is_read_back_every_round(store):
    # until a class has boundaries its tasks take the lowest tier: waiting a whole
    # refresh_s for the first ones put the first model's first seconds there
    settings = PlacementSettings(refresh_s=60.0, min_samples=20)
    now = [1000.0]
    source = SizeSource(settings, 3, lambda: now[0])
    classes = source.fetch(store, SizeClasses())  # the first read: nothing placed yet
    sizes = iter(bimodal(400))
    drawn = []
    for _ in range(3):  # one refresher round a second, 15 placements each
        now[0] += 1.0
        source.pending.extend(("cpu", next(sizes)) for _ in range(15))
        classes = source.fetch(store, classes)
        drawn.append("cpu" in classes.cuts)
    assert drawn == [False, True, True]  # 15, then 30 of min_samples 20
    # with boundaries the class waits refresh_s again: these are not shipped yet
    shipped = read_sizes(store)["cpu"].total
    now[0] += 1.0
    source.pending.extend(("cpu", next(sizes)) for _ in range(15))
    assert source.fetch(store, classes) is classes
    assert read_sizes(store)["cpu"].total == pytest.approx(shipped)


def test_the_batch_example_policy_is_the_documented_recipe():
    from pathlib import Path

    from celery_aitp.policy import read_policy_file

    path = Path(__file__).resolve().parents[2] / "examples" / "batch.yaml"
    policy = read_policy_file(str(path))
    assert policy.tier_weights() == {"hi": 4096, "mid": 64, "lo": 1}
    assert policy.placement.split_gain == 0 and policy.placement.min_size_ratio == 2


@pytest.mark.parametrize("field, value", [("split_gain", -0.1), ("min_size_ratio", 0.5)])
def test_bad_placement_split_settings_are_refused_by_path(field, value):
    from celery_aitp.errors import PolicyError
    from celery_aitp.policy import parse_policy

    with pytest.raises(PolicyError, match=rf"placement\.{field}"):
        parse_policy({"placement": {field: value}})


def test_boundaries_drawn_for_another_number_of_tiers_are_drawn_again_at_once(store):
    """The value a source of a policy with other tiers left in the view: dropped and
    drawn again in the next round, not kept for refresh_s."""
    settings = PlacementSettings(refresh_s=60.0, min_samples=20)
    now = [1000.0]
    source = SizeSource(settings, 3, lambda: now[0])
    source.pending.extend(("cpu", s) for s in bimodal(400))
    three = source.fetch(store, SizeClasses())
    assert len(three.cuts["cpu"]) == 2
    four = SizeClasses({"cpu": (3, 10, 20), "gpu": (3, 10, 20)})
    now[0] += 1.0  # well within refresh_s
    again = source.fetch(store, four)
    assert again.cuts == three.cuts  # gpu had too few sizes: no boundaries at all
    assert four.for_tiers(4) is four and four.for_tiers(3).cuts == {}
