"""The ideal non-preemptive worker the benchmarks compare orders with (benchmarks/ideal.py),
and the trace-bound figures built on it (benchmarks/trace_bounds.py)."""

from __future__ import annotations

import math

import pytest

from benchmarks.ideal import ideal_starts
from benchmarks.trace_bounds import _last_two, figures
from celery_aitp.learn.dataset import Observation
from celery_aitp.replay.trace import from_records

PUBLISHED = [0.0, 1.0, 2.0]
RUNTIME = [10.0, 5.0, 1.0]


def test_one_process_first_come_first_served() -> None:
    assert ideal_starts(PUBLISHED, RUNTIME, PUBLISHED, 1) == [0.0, 10.0, 15.0]


def test_one_process_shortest_first_never_interrupts_a_run() -> None:
    # the 10 s task started alone; the 1 s task then goes before the 5 s one
    assert ideal_starts(PUBLISHED, RUNTIME, RUNTIME, 1) == [0.0, 11.0, 10.0]


def test_more_processes_start_what_arrives_while_one_is_free() -> None:
    assert ideal_starts(PUBLISHED, RUNTIME, RUNTIME, 2) == [0.0, 1.0, 6.0]
    assert ideal_starts(PUBLISHED, RUNTIME, RUNTIME, 3) == PUBLISHED


def test_equal_keys_keep_the_order_of_arrival() -> None:
    published = [0.0, 0.0, 0.0]
    assert ideal_starts(published, [1.0, 1.0, 1.0], [7.0, 7.0, 7.0], 1) == [0.0, 1.0, 2.0]


def test_no_process_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="slots must be at least 1, not 0"):
        ideal_starts(PUBLISHED, RUNTIME, RUNTIME, 0)


def _trace(jobs: list[tuple[float, float]]):  # type: ignore[no-untyped-def]
    return from_records({"task": "job", "published_at": 100.0 + at, "runtime_s": runtime}
                        for at, runtime in jobs)


def test_trace_figures_count_only_after_the_warm_up_and_bound_the_slowdown() -> None:
    # one process: a 100 s warm-up job, then jobs of 1, 20 and 50 s waiting behind it
    trace = _trace([(0.0, 100.0), (1.0, 1.0), (2.0, 20.0), (3.0, 50.0)])
    fifo = figures(trace, trace.published, 1, 1)
    # the 1 s job counts as 10 s (the bound); short: the faster two of the three counted
    assert fifo["mean_slowdown"] == pytest.approx(
        ((99 + 1) / 10 + (99 + 20) / 20 + (118 + 50) / 50) / 3)
    assert fifo["short_wait_p95_s"] == pytest.approx(99.0)
    assert fifo["long_wait_max_s"] == pytest.approx(118.0)
    sjf = figures(trace, trace.runtime, 1, 1)
    assert sjf == fifo  # all three waited for the warm-up job: shortest first is FIFO here
    longest_first = figures(trace, [-r for r in trace.runtime], 1, 1)
    assert longest_first["long_wait_max_s"] == pytest.approx(97.0)
    assert longest_first["short_wait_p95_s"] == pytest.approx(148 + 0.95 * (169 - 148))
    assert longest_first["mean_slowdown"] > fifo["mean_slowdown"]


def test_last_two_falls_back_without_a_finished_run() -> None:
    fresh = Observation(0, "job", "default", 1.0, 2.0, 3.0, {}, None, 0)
    assert _last_two(fresh, 7.0) == 7.0
    fresh.history = (math.nan, *[math.nan] * 12)  # type: ignore[assignment]
    assert _last_two(fresh, 7.0) == 7.0
    fresh.history = (3.0, *[math.nan] * 12)  # type: ignore[assignment]
    assert _last_two(fresh, 7.0) == 3.0
