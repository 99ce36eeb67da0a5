"""The placement benchmark's raw-row analysis (benchmarks/placement_raw.py)."""

from __future__ import annotations

from typing import Any

from benchmarks.placement_raw import (
    free_arrival_waits,
    handoffs,
    idle_while_waiting,
    simulate,
)


def row(published: float, started: float, runtime: float, tenant: str = "a") -> dict[str, Any]:
    return {"published": published, "started": started, "finished": started + runtime,
            "runtime_s": runtime, "tenant": tenant}


def test_a_free_process_with_tasks_waiting_counts_as_a_stall() -> None:
    # Two slots. Both busy until 1.0; one frees at 1.0 but the waiting task starts at 1.5.
    rows = [row(0.0, 0.0, 1.0), row(0.0, 0.0, 2.0), row(0.5, 1.5, 1.0)]
    idle, longest = idle_while_waiting(rows, slots=2)
    assert longest == 0.5
    assert idle == 0.5
    assert handoffs(rows) == [0.5]


def test_no_stall_when_the_freed_process_takes_the_waiting_task_at_once() -> None:
    rows = [row(0.0, 0.0, 1.0), row(0.0, 0.0, 2.0), row(0.5, 1.0, 1.0)]
    assert idle_while_waiting(rows, slots=2) == (0.0, 0.0)
    assert handoffs(rows) == [0.0]


def test_free_arrivals_are_tasks_published_with_a_process_free_and_no_queue() -> None:
    rows = [row(0.0, 0.0, 1.0), row(0.2, 0.25, 1.0), row(0.3, 1.0, 1.0)]
    # the second arrives with one of two processes free and nothing queued; the third
    # arrives with both busy
    assert free_arrival_waits(rows, slots=2) == [0.0, 0.25 - 0.2]


def test_a_cost_per_start_raises_the_simulated_slowdown_of_a_loaded_worker() -> None:
    rows = [row(0.05 * i, 0.0, 0.09 if i % 5 else 0.4, "ab"[i % 2]) for i in range(200)]
    cheap, dear = simulate(rows, 0.0, False, slots=2), simulate(rows, 0.01, False, slots=2)
    assert dear > cheap
    # per tenant in turn serves every task exactly once as well
    assert simulate(rows, 0.0, True, slots=2) > 1.0
