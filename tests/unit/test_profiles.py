"""Resource profiles: decaying histograms, VPA-style targets, declarations, inference."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_aitp.priority_policy import ProfileSettings
from celery_aitp.profiles.histogram import GROWTH, bucket_of, bucket_upper, percentile
from celery_aitp.profiles.profile import FAMILIES, ObservedProfile, merge_profile
from celery_aitp.profiles.samples import fold, run_fields
from celery_aitp.profiles.store import ProfileBook, ProfileSource, ProfileStore
from celery_aitp.store.decayed import DecayedSums, decayed_values, decode_hash

SETTINGS = ProfileSettings()
ACCELERATORS = ("cpu", "gpu")


def write_runs(store, task: str, runs: list[dict], now: float,
               settings: ProfileSettings = SETTINGS) -> None:
    batch: dict[str, float] = {}
    for run in runs:
        fold(batch, run_fields(run))
    pipe = store.client.pipeline()
    ProfileStore(store, settings).queue_writes(pipe, {task: batch}, now)
    pipe.execute()


def profile_of(store, task: str, now: float, settings: ProfileSettings = SETTINGS):
    return ProfileStore(store, settings).read([task], now, ACCELERATORS)[task]


@settings(deadline=None)
@given(st.floats(min_value=1e-6, max_value=1e9, allow_nan=False))
def test_a_value_never_exceeds_its_bucket_and_the_bucket_is_at_most_5_percent_above(value):
    index = bucket_of(value, 0.001)
    assert bucket_upper(index, 0.001) >= value * (1 - 1e-9) or index == 700
    if index > 0 and index < 700:
        assert bucket_upper(index - 1, 0.001) < value * (1 + 1e-9)
        assert bucket_upper(index, 0.001) <= value * GROWTH * (1 + 1e-9)


def test_percentile_walks_cumulative_weights():
    weights: dict[int, float] = {}
    for v in range(1, 101):
        index = bucket_of(float(v), 1.0)
        weights[index] = weights.get(index, 0.0) + 1.0
    p90 = percentile(weights, 0.9, 1.0)
    assert 90 <= p90 <= 90 * GROWTH
    assert percentile({}, 0.9, 1.0) is None


@pytest.mark.parametrize("spread", [0.02, 0.1, 0.25])
def test_target_covers_at_least_95_percent_of_a_stable_tasks_runs(store, spread):
    rng = random.Random(7)
    runs = [{"cpu_s": rng.lognormvariate(-1.0, spread), "runtime_s": 1.0,
             "run_peak_rss_mb": rng.gauss(400.0, 400.0 * spread), "memory_scope": "run"}
            for _ in range(400)]
    write_runs(store, "stable", runs, now=1000.0)
    profile = profile_of(store, "stable", now=1000.0)
    cpu_cover = sum(r["cpu_s"] <= profile.cpu_s for r in runs) / len(runs)
    mem_cover = sum(r["run_peak_rss_mb"] <= profile.memory_mb for r in runs) / len(runs)
    assert cpu_cover >= 0.95 and mem_cover >= 0.95
    assert profile.runs == 400
    # and the target is not absurdly high: within margin + bucket error of the p90
    runs_cpu = sorted(r["cpu_s"] for r in runs)
    assert profile.cpu_s <= runs_cpu[int(0.9 * len(runs))] * 1.15 * GROWTH * 1.01


def test_too_few_runs_give_no_target_and_floors_apply(store):
    write_runs(store, "rare", [{"cpu_s": 0.5, "runtime_s": 1.0}] * 2, now=0.0)
    assert profile_of(store, "rare", 0.0).cpu_s is None
    write_runs(store, "tiny", [{"cpu_s": 0.0, "runtime_s": 1.0, "run_peak_rss_mb": 0.1,
                                "memory_scope": "run"}] * 5, now=0.0)
    tiny = profile_of(store, "tiny", 0.0)
    assert tiny.memory_mb == SETTINGS.floors.memory_mb  # 1 MB bucket * 1.15 < the 16 MB floor
    assert tiny.cpu_s >= SETTINGS.floors.cpu_s


def test_memory_measured_for_several_runs_or_the_process_is_ignored(store):
    runs = [{"cpu_s": 0.1, "runtime_s": 0.2, "run_peak_rss_mb": 9000.0,
             "memory_scope": scope} for scope in ("shared", "process")] * 5
    write_runs(store, "t", runs, now=0.0)
    assert profile_of(store, "t", 0.0).memory_mb is None


def test_old_runs_fade_with_the_half_life(store):
    settings = ProfileSettings(half_life_s=100.0)
    old = [{"cpu_s": 0.1, "runtime_s": 1.0, "run_peak_rss_mb": 100.0, "memory_scope": "run"}]
    new = [{"cpu_s": 0.1, "runtime_s": 1.0, "run_peak_rss_mb": 2000.0, "memory_scope": "run"}]
    write_runs(store, "t", old * 40, now=0.0, settings=settings)
    write_runs(store, "t", new * 3, now=0.0, settings=settings)
    assert profile_of(store, "t", 0.0, settings).memory_mb < 2000  # 3 of 43 runs: above p90
    write_runs(store, "t", new * 3, now=1000.0, settings=settings)  # 10 half-lives later
    assert profile_of(store, "t", 1000.0, settings).memory_mb >= 2000


def test_an_undeclared_task_seen_using_a_gpu_is_inferred_as_gpu(store):
    runs = [{"cpu_s": 0.1, "runtime_s": 1.0, "used_accelerator": "gpu"}]
    write_runs(store, "render", runs * 2, now=0.0)
    assert profile_of(store, "render", 0.0).accelerator is None  # 2 < min_samples
    write_runs(store, "render", runs, now=1.0)
    profile = profile_of(store, "render", 1.0)
    assert profile.accelerator == "gpu" and profile.accelerator_share == 1.0


def test_runs_that_could_not_tell_do_not_count_and_cpu_runs_outvote(store):
    unknown = [{"cpu_s": 0.1, "runtime_s": 1.0, "used_accelerator": None}] * 10
    write_runs(store, "t", unknown, now=0.0)
    assert profile_of(store, "t", 0.0).accelerator_runs == 0
    mixed = ([{"cpu_s": 0.1, "runtime_s": 1.0, "used_accelerator": "gpu"}] * 2
             + [{"cpu_s": 0.1, "runtime_s": 1.0, "used_accelerator": "none"}] * 3)
    write_runs(store, "m", mixed, now=0.0)
    profile = profile_of(store, "m", 0.0)
    assert profile.accelerator is None and profile.accelerator_share == pytest.approx(0.4)


def test_a_class_outside_the_policy_is_never_inferred(store):
    write_runs(store, "t", [{"cpu_s": 1.0, "runtime_s": 1.0, "used_accelerator": "tpu"}] * 5,
               now=0.0)
    assert profile_of(store, "t", 0.0).accelerator is None


def test_bad_run_values_are_skipped_not_raised():
    fields = run_fields({"cpu_s": float("nan"), "runtime_s": -1, "run_peak_rss_mb": "big",
                         "memory_scope": "run", "used_accelerator": "GPU; drop table"})
    assert fields == {"_n": 1.0}


def test_declarations_win_and_observed_values_stay_visible():
    observed = ObservedProfile(runs=9, cpu_s=0.2, cpu_cores=0.5, memory_mb=300.0,
                               accelerator="gpu", accelerator_share=1.0, accelerator_runs=9)
    merged = merge_profile({"accelerator": "cpu", "memory_mb": 4096}, observed,
                           frozenset(ACCELERATORS), "cpu")
    assert merged.accelerator == "cpu"
    record = merged.record
    assert record["memory_mb"] == 4096 and record["observed_memory_mb"] == 300.0
    assert record["cpu_cores"] == 0.5 and record["sources"]["cpu_cores"] == "observed"
    assert record["sources"]["accelerator"] == "declared"
    inferred = merge_profile({}, observed, frozenset(ACCELERATORS), "cpu")
    assert inferred.accelerator == "gpu" and inferred.record["sources"]["accelerator"] == \
        "observed"
    unknown = merge_profile({"accelerator": "tpu"}, None, frozenset(ACCELERATORS), "cpu")
    assert unknown.accelerator == "cpu" and unknown.notes == ("accelerator_unknown",)


def test_the_source_rereads_only_changed_profiles_and_drops_expired_ones(store, monkeypatch):
    clock = [0.0]
    source = ProfileSource(SETTINGS, ACCELERATORS, refresh_s=10.0, clock=lambda: clock[0])
    reads: list[list[str]] = []
    original = ProfileStore.read
    monkeypatch.setattr(ProfileStore, "read",
                        lambda self, tasks, *a: reads.append(list(tasks)) or
                        original(self, tasks, *a))
    run = {"cpu_s": 0.1, "runtime_s": 1.0, "used_accelerator": "gpu"}
    write_runs(store, "a", [run] * 3, now=0.0)
    book = source.fetch(store, ProfileBook())
    assert book.profiles["a"].accelerator == "gpu" and reads == [["a"]]
    clock[0] = 5.0
    assert source.fetch(store, book) is book  # not yet time to refresh
    clock[0] = 20.0
    again = source.fetch(store, book)
    assert reads == [["a"]] and again.profiles["a"] == book.profiles["a"]  # nothing changed
    write_runs(store, "b", [run] * 3, now=25.0)
    clock[0] = 40.0
    third = source.fetch(store, again)
    assert reads[-1] == ["b"] and set(third.profiles) == {"a", "b"}
    profiles = ProfileStore(store, SETTINGS)
    store.client.delete(profiles.key("a"))  # its histogram expired
    store.client.hset(profiles.index, "a", "99")
    clock[0] = 60.0
    fourth = source.fetch(store, third)
    assert set(fourth.profiles) == {"b"} and "a" not in profiles.read_index()


def test_profiles_beyond_max_tasks_drop_the_least_recently_run(store):
    settings = ProfileSettings(max_tasks=3)
    profiles = ProfileStore(store, settings)
    for i in range(5):
        write_runs(store, f"t{i}", [{"cpu_s": 0.1, "runtime_s": 1.0}], now=float(i),
                   settings=settings)
    assert profiles.trim(len(profiles.read_index())) == 2
    assert sorted(profiles.read_index()) == ["t2", "t3", "t4"]
    assert not store.client.exists(profiles.key("t0"))


def test_decayed_sums_rebase_without_changing_relative_weights(store):
    sums = DecayedSums(store)
    sums.add_now("unit:d", {"a": 1.0, "_n": 1}, now=0.0, half_life_s=1.0)
    sums.add_now("unit:d", {"a": 1.0, "b": 1.0, "_n": 1}, now=100.0, half_life_s=1.0)
    values, raw = decayed_values(decode_hash(store.client.hgetall("unit:d")), 100.0)
    assert values["a"] == pytest.approx(1.0) and values["b"] == pytest.approx(1.0)
    assert raw["_n"] == 2
    assert set(FAMILIES) == {"cpu", "cores", "mem"}

