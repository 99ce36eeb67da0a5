"""The replay simulator's core semantics: consumption order, slots, ties, determinism."""

from __future__ import annotations

import math

import pytest

from celery_aitp.replay.engine import Engine, KeptProcesses, SimWorker, priority_step
from celery_aitp.worker import tier_cycle


def fixed(queues: dict[int, str], priorities: dict[int, int] | None = None):
    """A router sending task i to queues[i] (label = queue name)."""
    priorities = priorities or {}
    return lambda i, now: (queues[i], priorities.get(i, 0), queues[i])


def run(workers, published, runtime, route, overhead=0.0):
    return Engine(workers, overhead).run(published, runtime, route)


def test_one_slot_serves_the_highest_queue_first_then_fifo():
    # task 0 occupies the only slot; 1..4 queue up; the worker reads hi before lo
    worker = SimWorker("w", "cpu", ["hi", "lo"], slots=1)
    queues = {0: "lo", 1: "lo", 2: "hi", 3: "lo", 4: "hi"}
    out = run([worker], [0.0, 0.1, 0.2, 0.3, 0.4], [1.0] * 5, fixed(queues))
    order = sorted(range(5), key=lambda i: out.started[i])
    assert order == [0, 2, 4, 1, 3]
    assert out.started == [0.0, 3.0, 1.0, 4.0, 2.0]


def test_a_slot_takes_a_message_only_when_free():
    worker = SimWorker("w", "cpu", ["q"], slots=2)
    out = run([worker], [0.0, 0.0, 0.0], [1.0, 3.0, 1.0], fixed({0: "q", 1: "q", 2: "q"}))
    assert out.started == [0.0, 0.0, 1.0]  # the third waits for the first free slot
    assert out.makespan_s == 3.0


def test_overhead_keeps_the_slot_busy_after_the_run():
    worker = SimWorker("w", "cpu", ["q"], slots=1)
    out = run([worker], [0.0, 0.0], [1.0, 1.0], fixed({0: "q", 1: "q"}), overhead=0.25)
    assert out.started == [0.0, 1.25]


def test_message_priority_steps_come_before_queue_order_as_on_redis():
    # kombu reads every queue's step-0 list before any step-3 list: a lo message at
    # priority 0 beats a hi message at priority 3
    assert [priority_step(p) for p in (-1, 0, 2, 3, 5, 6, 9, 12)] == [0, 0, 0, 3, 3, 6, 9, 9]
    worker = SimWorker("w", "cpu", ["hi", "lo"], slots=1)
    queues = {0: "hi", 1: "hi", 2: "lo"}
    out = run([worker], [0.0, 0.1, 0.2], [1.0] * 3, fixed(queues, {1: 3}))
    assert out.started[2] < out.started[1]


def test_round_robin_strategy_rotates_between_queues():
    worker = SimWorker("w", "cpu", ["a", "b"], slots=1, strategy="round_robin")
    queues = {0: "a", 1: "a", 2: "a", 3: "b", 4: "b"}
    out = run([worker], [0.0, 0.1, 0.2, 0.3, 0.4], [1.0] * 5, fixed(queues))
    order = sorted(range(5), key=lambda i: out.started[i])
    assert [queues[i] for i in order] == ["a", "b", "a", "b", "a"]


def test_an_arrival_goes_to_the_idle_worker_blocked_longest():
    w1 = SimWorker("w1", "cpu", ["q"], slots=1)
    w2 = SimWorker("w2", "cpu", ["q"], slots=1)
    # task 0 runs on w1 (first idle), task 1 on w2; w2 frees at 1.5, w1 at 2.0, so at
    # 3.0 w2 has been waiting longer and takes task 2
    out = run([w1, w2], [0.0, 0.5, 3.0, 3.0], [2.0, 1.0, 5.0, 5.0],
              fixed({0: "q", 1: "q", 2: "q", 3: "q"}))
    assert out.started == [0.0, 0.5, 3.0, 3.0]
    assert out.worker == [0, 1, 1, 0]


def test_a_queue_nobody_reads_strands_its_tasks():
    worker = SimWorker("w", "cpu", ["q"], slots=1)
    out = run([worker], [0.0, 1.0], [1.0, 1.0], fixed({0: "q", 1: "nobody"}))
    assert out.stranded == [1] and math.isnan(out.started[1])


def test_workers_read_only_their_own_queues():
    cpu = SimWorker("cpu", "cpu", ["c"], slots=1)
    gpu = SimWorker("gpu", "gpu", ["g"], slots=1)
    out = run([cpu, gpu], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0], fixed({0: "c", 1: "c", 2: "g"}))
    assert out.started == [0.0, 1.0, 0.0]


def test_same_input_same_output():
    import random

    rng = random.Random(3)
    published = sorted(rng.uniform(0, 50) for _ in range(2000))
    runtime = [rng.expovariate(5) for _ in published]
    queues = {i: rng.choice(["hi", "mid", "lo"]) for i in range(2000)}
    workers = [SimWorker("a", "cpu", ["hi", "mid", "lo"], 3),
               SimWorker("b", "cpu", ["hi", "mid", "lo"], 2)]
    first = run(workers, published, runtime, fixed(queues))
    second = run(workers, published, runtime, fixed(queues))
    assert first.started == second.started and first.label_names == second.label_names


def test_bad_workers_are_refused():
    with pytest.raises(ValueError, match="slots must be at least 1"):
        SimWorker("w", "cpu", ["q"], slots=0)
    with pytest.raises(ValueError, match="at least one"):
        Engine([])


def reserve_worker(slots: int = 3, kept: int | None = 1) -> SimWorker:
    """A worker reading hi then lo in the weighted tier order, keeping ``kept`` of its
    processes from the lo tier (None: no reserve)."""
    plan = None if kept is None else KeptProcesses(frozenset({"lo"}), kept, 1.5)
    return SimWorker("w", "cpu", ["hi", "lo"], slots, tier_cycle.STRATEGY, reserve=plan)


#: lo0 is timed (1 s: the longest wait becomes 1.5 s), hi1 is read at 1.0, three long
#: lo tasks come at 1.1, and a short hi task at 1.5
RESERVE_CASE = ({0: "lo", 1: "hi", 2: "lo", 3: "lo", 4: "lo", 5: "hi"},
                [0.0, 1.0, 1.1, 1.1, 1.1, 1.5], [1.0, 0.05, 10.0, 10.0, 10.0, 0.05])


def test_a_kept_process_runs_the_short_task_and_the_held_one_starts_after_its_longest_wait():
    queues, published, runtime = RESERVE_CASE
    out = run([reserve_worker()], published, runtime, fixed(queues))
    assert out.started[2] == out.started[3] == 1.1  # two of three processes for lo
    assert out.started[5] == 1.5  # the kept process: the short task does not wait
    # the third lo task is woken when it has waited the longest wait (1.5 mean runs)
    assert out.started[4] == pytest.approx(1.1 + 1.5, abs=1e-3)


def test_without_the_reserve_the_short_task_waits_for_a_long_run():
    queues, published, runtime = RESERVE_CASE
    out = run([reserve_worker(kept=None)], published, runtime, fixed(queues))
    assert out.started[4] == 1.1
    assert out.started[5] == pytest.approx(11.1)


def test_the_reserve_lets_go_once_no_higher_tier_was_read_for_the_longest_wait():
    # no short task at 1.5: the last higher read (1.0) lets go at 2.5, before the wait
    queues, published, runtime = RESERVE_CASE
    out = run([reserve_worker()], published[:5], runtime[:5], fixed(queues))
    assert out.started[4] == pytest.approx(1.0 + 1.5, abs=1e-3)


def test_the_reserve_needs_the_weighted_tier_order():
    worker = SimWorker("w", "cpu", ["hi", "lo"], 3, "priority",
                       reserve=KeptProcesses(frozenset({"lo"}), 1, 1.5))
    with pytest.raises(ValueError, match="weighted tier order"):
        run([worker], [0.0], [1.0], fixed({0: "lo"}))


@pytest.mark.parametrize("kept", [0, 3])
def test_a_reserve_must_leave_the_lowest_tier_a_slot_and_keep_one(kept):
    with pytest.raises(ValueError, match="keeps 1 to 2 of its 3 slots"):
        run([reserve_worker(kept=kept)], [0.0], [1.0], fixed({0: "lo"}))


def test_a_wake_up_after_the_last_run_does_not_stretch_the_makespan():
    # the held lo task starts when a short lo run ends (1.3), long before its wake-up (2.5)
    queues = {0: "lo", 1: "hi", 2: "lo", 3: "lo", 4: "lo"}
    out = run([reserve_worker()], [0.0, 1.0, 1.1, 1.1, 1.1], [1.0, 0.05, 0.2, 0.2, 0.2],
              fixed(queues))
    assert out.started[4] == pytest.approx(1.3)
    assert out.makespan_s == pytest.approx(1.5)


# --- workers sharing a machine's cores (an express worker beside a regular one) --------

def test_runs_sharing_cores_slow_each_other_down_and_count_the_time_lost():
    worker = SimWorker("w", "cpu", ["q"], slots=2, machine="m")
    out = Engine([worker], cores={"m": 1}).run([0.0, 0.0], [1.0, 1.0],
                                               fixed({0: "q", 1: "q"}))
    assert out.started == [0.0, 0.0]
    assert out.lost == pytest.approx([1.0, 1.0])  # each ran at half speed: ended at 2 s
    assert out.makespan_s == pytest.approx(2.0)


def test_an_express_slot_runs_a_short_task_while_every_regular_slot_is_long():
    regular = SimWorker("w", "cpu", ["hi", "lo"], slots=4, machine="m")
    express = SimWorker("x", "cpu", ["hi"], slots=1, machine="m")
    queues = {0: "lo", 1: "lo", 2: "lo", 3: "lo", 4: "hi", 5: "lo"}
    published = [0.0, 0.0, 0.0, 0.0, 0.5, 0.6]
    runtime = [1.0, 1.0, 1.0, 1.0, 0.1, 1.0]
    out = Engine([regular, express], cores={"m": 4}).run(published, runtime, fixed(queues))
    assert out.started[4] == 0.5 and out.worker[4] == 1  # at once, on the express slot
    # five runs on four cores for its 0.125 s: it and each long run lose 0.025 s
    assert out.lost[4] == pytest.approx(0.025)
    assert out.lost[:4] == pytest.approx([0.025] * 4)
    assert out.started[5] == pytest.approx(1.025)  # the lo task waits for a regular slot
    alone = Engine([SimWorker("w", "cpu", ["hi", "lo"], slots=4)]).run(
        published, runtime, fixed(queues))
    assert alone.started[4] == 1.0 and alone.lost == [0.0] * 6  # without: after a long run


def test_a_machine_needs_its_core_count():
    with pytest.raises(ValueError, match="machines without a core count: m"):
        Engine([SimWorker("w", "cpu", ["q"], slots=1, machine="m")]).run(
            [0.0], [1.0], fixed({0: "q"}))
