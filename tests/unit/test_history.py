"""The per-(tenant, task) history summary: bounded, updated by workers, read by producers."""

from __future__ import annotations

import math

import pytest

from celery_aitp.errors import StoreError
from celery_aitp.predict.features import HISTORY_DEPTH, argument_features, call_signature
from celery_aitp.predict.history import (
    BOUND_HALF_LIFE_S,
    EMPTY_HISTORY,
    HistorySink,
    HistorySource,
    HistoryStore,
    HistoryView,
    Run,
    estimate,
    held_bound,
    parse_entry,
)
from celery_aitp.telemetry.counters import Counters


def test_runs_are_kept_newest_first_and_capped(store):
    history = HistoryStore(store)
    history.add_runs([("acme", "report", float(i)) for i in range(30)])
    history.add_runs([("acme", "resize", 0.5)])
    entries = history.read()
    count, runtimes = entries[("acme", "report")]
    assert count == 30 and len(runtimes) == HISTORY_DEPTH
    assert runtimes[:3] == [29.0, 28.0, 27.0]
    assert entries[("acme", "resize")] == (1, [0.5])
    assert history.version() == 2


def test_the_summary_holds_a_bounded_number_of_pairs(store):
    history = HistoryStore(store, max_pairs=3)  # fields: the tenant's own, then two pairs
    refused = history.add_runs([("t", f"task{i}", 1.0) for i in range(5)])
    assert refused == 3 and len(history.read()) == 3
    assert set(history.read()) == {("t", ""), ("t", "task0"), ("t", "task1")}
    assert history.add_runs([("t", "task0", 2.0)]) == 0  # known fields keep updating


def test_malformed_entries_are_ignored():
    assert parse_entry(b"3;1.5,2") == (3, [1.5, 2.0])
    assert parse_entry(b"garbage") is None and parse_entry(b"x;1") is None
    assert parse_entry(b"2;-1,nan") is None


def test_cold_start_estimates_are_last_two_mean_and_longest_recent_run():
    assert estimate([2.0, 4.0, 100.0]) == (3.0, 100.0)
    # a bimodal task: whatever the luck of the window, every call gets the same bound,
    # so a history never puts one call of it ahead of another
    rare_long = [0.03] * 19 + [1.0]
    assert estimate(rare_long)[1] == estimate([1.0, *[0.03] * 19])[1] == 1.0
    view = HistoryView.from_entries({("a", "t"): (5, [1.0, 3.0]), ("b", "t"): (1, [10.0])})
    # the bound is the task's longest recent run over every tenant (b's 10 s)
    assert view.estimates[("a", "t")] == (2.0, 10.0)
    assert view.task_estimates["t"] == (14.0 / 3, 10.0)  # last two of each tenant, pooled
    assert view.features[("a", "t")][:3] == (2.0, 2.0, 5)


def test_calls_of_one_task_get_the_same_cold_bound_whatever_the_tenant():
    # acme drew a long call lately, globex did not: the history cannot tell their calls
    # apart, so both get the same upper bound (one size class), each its own median
    view = HistoryView.from_entries({("acme", "t"): (20, [0.03, 0.04, 1.2]),
                                     ("globex", "t"): (20, [0.02, 0.05, 0.03]),
                                     ("globex", "other"): (3, [0.01])})
    assert view.estimates[("acme", "t")][1] == view.estimates[("globex", "t")][1] == 1.2
    assert view.estimates[("globex", "t")][0] == pytest.approx(0.035)
    assert view.estimates[("globex", "other")] == (0.01, 0.01)  # another task: its own


def test_the_cold_bound_is_held_and_let_down_slowly():
    # a heavy-tailed task: its 3 s call has left the window of recent runs, the bound
    # stays (calls of the task keep one size class) and falls with the half-life
    first = HistoryView.from_entries({("a", "t"): (20, [0.1, 3.0])}, fetched_at=0.0)
    assert first.estimates[("a", "t")][1] == 3.0
    later = HistoryView.from_entries({("a", "t"): (40, [0.1, 0.2])}, fetched_at=1.0,
                                     previous=first)
    assert later.estimates[("a", "t")][1] == pytest.approx(3.0, rel=0.01)
    much_later = HistoryView.from_entries({("a", "t"): (60, [0.1, 0.2])},
                                          fetched_at=1.0 + 2 * BOUND_HALF_LIFE_S,
                                          previous=later)
    assert much_later.estimates[("a", "t")][1] == pytest.approx(0.75, rel=0.01)
    assert held_bound(0.2, (3.0, 0.0), 100 * BOUND_HALF_LIFE_S) == 0.2  # back to the runs
    assert held_bound(5.0, (3.0, 0.0), 0.0) == 5.0  # a longer run raises it at once


def test_the_source_holds_the_bound_across_rereads(store):
    now = [0.0]
    source = HistorySource(interval_s=0.0, clock=lambda: now[0])
    history = HistoryStore(store)
    history.add_runs([("acme", "t", 3.0)])
    first = source.fetch(store, EMPTY_HISTORY)
    history.add_runs([("acme", "t", 0.1)] * 25)  # the 3 s run leaves the window
    now[0] = BOUND_HALF_LIFE_S
    assert source.fetch(store, first).estimates[("acme", "t")][1] == pytest.approx(1.5)


def test_a_tenants_first_run_of_a_task_gets_the_tenants_history(store):
    history = HistoryStore(store)
    history.add_runs([("acme", "report", 4.0), ("acme", "resize", 2.0)])
    view = HistoryView.from_entries(history.read())
    assert ("acme", "") not in view.features and "" not in view.task_estimates
    pair = view.of("acme", "report")
    assert pair is not None and pair[0] == 4.0 and pair[-2] == 3.0  # t_last2: 2.0 and 4.0
    first = view.of("acme", "export")  # never ran: only the tenant's runs are known
    assert first is not None and math.isnan(first[0]) and first[-1] == 3.0
    assert view.of("globex", "report") is None


def test_the_source_rereads_only_when_the_version_moves(store):
    source = HistorySource(interval_s=0.0)
    assert source.fetch(store, EMPTY_HISTORY) is EMPTY_HISTORY
    HistoryStore(store).add_runs([("acme", "t", 1.0)])
    first = source.fetch(store, EMPTY_HISTORY)
    assert first.estimates[("acme", "t")] == (1.0, 1.0)
    assert source.fetch(store, first) is first
    HistoryStore(store).add_runs([("acme", "t", 3.0)])
    assert source.fetch(store, first).estimates[("acme", "t")] == (2.0, 3.0)
    throttled = HistorySource(interval_s=3600.0)
    assert throttled.fetch(store, first) is first  # too soon: not even the version is read


class DownStore:
    class client:  # noqa: N801 - mimics RedisStore.client
        @staticmethod
        def register_script(_text):
            def run(**_):
                raise StoreError("down")
            return run

    class keys:  # noqa: N801
        @staticmethod
        def any(*parts):
            return ":".join(parts)


def test_the_sink_keeps_runs_for_the_next_round_when_the_store_is_down(store):
    counters = Counters()
    sink = HistorySink(counters, capacity=3)
    for i in range(5):
        sink.add("acme", "t", float(i))
    assert counters.totals["history_dropped"] == 2 and len(sink) == 3
    with pytest.raises(StoreError):
        sink.flush(DownStore())  # type: ignore[arg-type]
    assert len(sink) == 3
    sink.flush(store)
    assert len(sink) == 0
    count, runtimes = HistoryStore(store).read()[("acme", "t")]
    assert count == 3 and runtimes == [4.0, 3.0, 2.0]
    assert not math.isnan(runtimes[0])


def test_runs_are_kept_per_magnitude_class_of_their_task(store):
    history = HistoryStore(store)
    history.add_runs([Run("acme", "job", 0.03, 5), Run("globex", "job", 0.04, 5),
                      Run("acme", "job", 1.2, 10), Run("acme", "job", 0.5)])
    assert history.read_classes() == {("job", 5): (2, [0.04, 0.03]), ("job", 10): (1, [1.2])}
    assert history.read()[("acme", "job")] == (3, [0.5, 1.2, 0.03])  # as before
    store.client.hset(history.classes_key, "junk", "1;2")  # not written by a worker
    store.client.hset(history.classes_key, "x|job", "1;2")
    assert set(history.read_classes()) == {("job", 5), ("job", 10)}


def test_a_magnitude_class_sizes_its_calls_only_when_reliably_shorter_than_the_task():
    pairs = {("acme", "job"): (40, [1.5, 0.03, 0.02])}
    classes = {("job", 6): (12, [0.03, 0.05, 0.02, 0.04, 0.03]),  # short calls
               ("job", 10): (6, [1.5, 0.9, 1.2, 1.1, 0.7]),  # as long as the task's longest
               ("job", 4): (4, [0.01] * 4)}  # too few runs yet
    view = HistoryView.from_entries(pairs, classes=classes)
    assert view.class_estimates == {("job", 6): (0.04, 0.05)}
    assert view.of_class("job", [40], {}) == (0.04, 0.05)  # 40 is in class 6 (32-63)
    assert view.of_class("job", [600], {}) is None  # class 10: the task's own bound applies
    assert view.of_class("job", [10], {}) is None and view.of_class("job", [], {}) is None
    assert view.of_class("other", [40], {}) is None
    # the class's bound is held and let down slowly, like the task's
    later = HistoryView.from_entries(pairs, fetched_at=view.fetched_at + 1, previous=view,
                                     classes={("job", 6): (13, [0.01] * 5)})
    assert later.class_estimates[("job", 6)][1] == pytest.approx(0.05, rel=0.01)


def test_the_sink_keeps_a_runs_magnitude_class(store):
    sink = HistorySink(Counters())
    sink.add("acme", "job", 0.03, 5)
    sink.add("acme", "job", 0.04)
    sink.flush(store)
    assert HistoryStore(store).read_classes() == {("job", 5): (1, [0.03])}


def test_a_worker_records_the_magnitude_class_of_a_runs_arguments(store):
    from celery_aitp.worker.observe import record_run

    sink = HistorySink(Counters())
    ledger = type("Ledger", (), {"add": lambda self, record: None})()
    base = {"task": "job", "tenant": "acme", "outcome": "SUCCESS", "runtime_s": 0.03,
            "args": [40], "kwargs": {}}
    record_run(ledger, sink, base)
    record_run(ledger, sink, {**base, "args": "[not a list]", "kwargs": None})
    sink.flush(store)
    assert HistoryStore(store).read_classes() == {("job", 6): (1, [0.03])}
    assert HistoryStore(store).read()[("acme", "job")][0] == 2


def test_runs_are_kept_per_call_of_their_task_over_every_tenant(store):
    history = HistoryStore(store)
    history.add_runs([Run("acme", "job", 0.3, None, "aa"), Run("globex", "job", 0.5, None, "aa"),
                      Run("acme", "job", 0.4, None, "aa"), Run("acme", "job", 9.0, None, "bb"),
                      Run("acme", "other", 1.0, None, "aa"), Run("acme", "job", 2.0)])
    assert history.read_calls() == {("job", "aa"): (3, [0.4, 0.5]),  # the last two only
                                     ("job", "bb"): (1, [9.0]), ("other", "aa"): (1, [1.0])}
    assert history.read()[("acme", "job")][0] == 4  # the pair's history as before


def test_a_full_calls_hash_starts_over_and_repeating_calls_keep_their_history(store):
    history = HistoryStore(store, max_calls=3)
    history.add_runs([Run("t", "job", float(i), None, f"c{i}") for i in range(3)])
    assert store.client.hlen(history.calls_key) == 3
    history.add_runs([Run("t", "job", 5.0, None, "c3")])  # full: a new generation
    assert store.client.hlen(history.calls_key) == 1
    assert store.client.hlen(history.old_calls_key) == 3
    history.add_runs([Run("t", "job", 7.0, None, "c0")])  # moves over with its runs
    assert store.client.hget(history.calls_key, "c0|job") == b"2;7,0"
    calls = history.read_calls()
    assert calls[("job", "c0")] == (2, [7.0, 0.0]) and calls[("job", "c1")] == (1, [1.0])
    assert len(calls) == 4  # both generations are read
    store.client.hset(history.calls_key, "junk", "1;2")  # fields no worker wrote
    store.client.hset(history.calls_key, "x|job", "not a count")
    assert len(history.read_calls()) == 4
    history.add_runs([Run("t", "job", 1.0, None, f"d{i}") for i in range(5)])
    assert store.client.hlen(history.calls_key) <= 3  # never more than two generations
    assert store.client.hlen(history.old_calls_key) <= 3


def test_a_view_sizes_a_call_that_ran_twice_by_its_own_runs():
    signature = call_signature(argument_features((40,), {"rows": 9}))
    once = call_signature(argument_features((7,), {}))
    view = HistoryView.from_entries({("acme", "job"): (3, [1.0, 2.0, 3.0])},
                                    calls={("job", signature): (5, [0.2, 0.4]),
                                           ("job", once): (1, [9.0])})
    assert view.of_call("job", (40,), {"rows": 9}) == pytest.approx((0.3, 0.4))
    assert view.of_call("job", [40], {"rows": 9}) == pytest.approx((0.3, 0.4))
    assert view.of_call("job", (7,), {}) is None  # ran once: not its own estimate yet
    assert view.of_call("job", (41,), {"rows": 9}) is None  # another call
    assert view.of_call("other", (40,), {"rows": 9}) is None
    assert EMPTY_HISTORY.of_call("job", (40,), {"rows": 9}) is None
    # a task none of whose calls ran twice is not signed at all (its calls do not repeat)
    never = HistoryView.from_entries({}, calls={("job", once): (1, [0.2])})
    assert never.called == frozenset() and never.of_call("job", (7,), {}) is None


def test_the_source_reads_the_calls(store):
    HistoryStore(store).add_runs([Run("acme", "job", 0.5, None, "aa")])
    view = HistorySource().fetch(store, EMPTY_HISTORY)
    assert view.call_estimates == {} and view.called == frozenset()
    HistoryStore(store).add_runs([Run("acme", "job", 0.7, None, "aa")])
    view = HistorySource(interval_s=0).fetch(store, view)
    assert view.call_estimates == {("job", "aa"): (pytest.approx(0.6), 0.7)}
    assert view.called == {"job"}


def test_a_worker_records_the_call_of_a_runs_arguments(store):
    from celery_aitp.worker.observe import record_run

    sink = HistorySink(Counters())
    ledger = type("Ledger", (), {"add": lambda self, record: None})()
    base = {"task": "job", "tenant": "acme", "outcome": "SUCCESS", "runtime_s": 0.03,
            "args": [40], "kwargs": {"rows": 9}}
    record_run(ledger, sink, base)  # no recorded features: signed from the arguments
    features = {**argument_features((40,), {"rows": 9}, 4, 11), "arg1": None}
    record_run(ledger, sink, {**base, "runtime_s": 0.05, "features": features})
    record_run(ledger, sink, {**base, "outcome": "FAILURE", "runtime_s": 9.0})
    sink.flush(store)
    signature = call_signature(argument_features((40,), {"rows": 9}))
    assert HistoryStore(store).read_calls() == {("job", signature): (2, [0.05, 0.03])}
