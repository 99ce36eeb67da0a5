"""Analysis of observation records: prediction error, route differences, arms, wait model."""

from __future__ import annotations

import heapq
import random
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from celery_aitp.cli.celery_command import aitp
from celery_aitp.migration.analysis import arm_stats, prediction_error, route_differences
from celery_aitp.migration.waitmodel import STANDARD, effective_servers, model_waits
from celery_aitp.policy import SplitSettings, parse_policy
from celery_aitp.publish.split import SplitRule
from tests.conftest import TEST_POLICY

POLICY = parse_policy(TEST_POLICY)


def run(**fields: Any) -> dict[str, Any]:
    base = {"task": "t", "tenant": "acme", "tier": "hi", "routed": False, "reason": "shadow",
            "queue": "celery", "would_queue": "aitp.acme.cpu.hi", "wait_s": 0.1,
            "runtime_s": 1.0, "outcome": "SUCCESS", "started_at": 0.0}
    base.update(fields)
    return base


def test_prediction_error_by_task_and_tenant():
    records = [run(task="a", predicted_runtime_s=2.0, runtime_s=1.0, predicted_p90_s=3.0),
               run(task="a", predicted_runtime_s=1.0, runtime_s=1.0, predicted_p90_s=1.5),
               run(task="a", predicted_runtime_s=1.0, runtime_s=4.0, predicted_p90_s=2.0),
               run(task="b", tenant="globex", predicted_runtime_s=0.5, runtime_s=0.001),
               run(task="c")]  # no prediction: not counted
    by_task = prediction_error(records, lambda r: r["task"])
    assert set(by_task) == {"a", "b"}
    a = by_task["a"]
    assert a.n == 3 and a.mae_s == pytest.approx((1 + 0 + 3) / 3)
    assert a.bias_s == pytest.approx((1 + 0 - 3) / 3)
    assert a.median_rel_error == pytest.approx(0.75)  # errors 1.0, 0.0, 0.75
    assert a.p90_coverage == pytest.approx(2 / 3)
    b = by_task["b"]
    assert b.median_rel_error == pytest.approx((0.5 - 0.001) / 0.01)  # floored actual
    assert b.p90_coverage is None
    assert set(prediction_error(records, lambda r: r["tenant"])) == {"acme", "globex"}


def test_route_differences_count_only_runs_the_middleware_would_have_moved():
    records = [run(), run(), run(reason="no_live_worker"),
               run(tier="lo", would_queue="aitp.acme.cpu.lo"),
               run(routed=True, reason="routed", queue="aitp.acme.cpu.hi")]
    diff = route_differences(records)
    assert diff.standard == 4 and diff.differ == 3 and diff.share == pytest.approx(0.75)
    assert diff.pairs == {("celery", "aitp.acme.cpu.hi"): 2, ("celery", "aitp.acme.cpu.lo"): 1}


def test_arm_stats_sla_failures_fallbacks_and_control_group():
    records = (
        [run(arm="routed", routed=True, wait_s=0.5) for _ in range(8)]
        + [run(arm="routed", routed=True, wait_s=3.0, outcome="FAILURE")]
        + [run(arm="routed", routed=False, reason="no_live_worker", wait_s=0.2)]
        # a retry kept in the tier queue it came from: not a fallback, though not placed
        + [run(arm="routed", routed=False, reason="explicit_queue", wait_s=0.2)]
        + [run(arm="standard", wait_s=2.0) for _ in range(5)]
        + [run(arm="standard", tenant="globex", tier="mid", wait_s=20.0) for _ in range(5)]
        + [run(arm=None, wait_s=99.0)]  # not a split-stage run
    )
    arms = arm_stats(records, POLICY, SplitRule(SplitSettings(percent=10, tenants=("acme",))))
    routed, standard, control = arms["routed"], arms["standard"], arms["control"]
    assert routed.n == 11 and routed.sla_hit_rate == pytest.approx(10 / 11)  # hi SLA: 1 s
    assert routed.failure_rate == pytest.approx(1 / 11)
    assert routed.fell_back == 1 and routed.fallback_rate == pytest.approx(1 / 11)
    assert standard.n == 10 and standard.sla_hit_rate == 0.0  # 2 s > 1 s, 20 s > 10 s
    assert control.n == 5 and control.wait(0.9) == pytest.approx(2.0)  # acme only


def test_a_wait_negative_beyond_a_second_is_clock_skew_not_an_sla_hit():
    """The guard read a run of a producer 15 s ahead (wait -15 s) as a hit, clamped to
    a 0 s wait: skew made a routed arm look faster and on time."""
    records = [run(arm="routed", routed=True, wait_s=w) for w in (-15.0, -0.5, 5.0)]
    routed = arm_stats(records, POLICY)["routed"]
    assert routed.n == 3 and routed.waits == [0.0, 5.0]
    assert (routed.sla_checked, routed.sla_hits) == (2, 1)  # -0.5 s: synced clocks, a hit
    assert routed.clock_skew == 1


def _simulate(rate: float, n: int, hi_share: float, seed: int = 7) -> tuple[list, list]:
    """One server, Poisson arrivals, exponential service: FIFO runs and priority runs."""
    rnd = random.Random(seed)
    t, jobs = 0.0, []
    for i in range(n):
        t += rnd.expovariate(rate)
        jobs.append((t, rnd.expovariate(1.0), "hi" if rnd.random() < hi_share else "lo", i))
    fifo, free = [], 0.0
    for arrival, service, tier, _ in jobs:
        start = max(free, arrival)
        free = start + service
        fifo.append(run(tier=tier, wait_s=start - arrival, runtime_s=service, started_at=start))
    prio: list[dict[str, Any]] = []
    waiting: list[tuple[int, float, float, str]] = []
    free, i = 0.0, 0
    while i < len(jobs) or waiting:
        if not waiting and jobs[i][0] > free:
            free = jobs[i][0]
        while i < len(jobs) and jobs[i][0] <= free:
            arrival, service, tier, _ = jobs[i]
            heapq.heappush(waiting, (0 if tier == "hi" else 1, arrival, service, tier))
            i += 1
        _, arrival, service, tier = heapq.heappop(waiting)
        prio.append(run(tier=tier, wait_s=free - arrival))
        free += service
    return fifo, prio


def test_wait_model_predicts_a_simulated_priority_queue_from_fifo_observations():
    fifo, prio = _simulate(rate=0.7, n=40_000, hi_share=0.3)
    model = model_waits(fifo, ["hi", "mid", "lo"])
    assert model is not None
    assert model.servers == pytest.approx(1.0, rel=0.1)
    assert model.utilisation == pytest.approx(0.7, rel=0.1)
    by = {c.name: c for c in model.classes}
    assert set(by) == {"hi", "lo"}
    for tier in ("hi", "lo"):
        simulated = sum(r["wait_s"] for r in prio if r["tier"] == tier) / sum(
            r["tier"] == tier for r in prio)
        assert by[tier].modelled_wait_s == pytest.approx(simulated, rel=0.15), tier
    assert by["hi"].difference_s < 0 < by["lo"].difference_s


def test_wait_model_puts_tasks_that_would_not_route_last_and_ignores_routed_runs():
    records = [run(started_at=float(i), wait_s=0.5, runtime_s=0.5) for i in range(10)]
    records += [run(started_at=float(i), reason="no_live_worker", wait_s=0.5) for i in range(10)]
    records += [run(routed=True, started_at=1.0, wait_s=100.0)]
    model = model_waits(records, ["hi", "mid", "lo"])
    assert model is not None and model.n == 20
    assert [c.name for c in model.classes] == ["hi", STANDARD]
    assert model.observed_wait_s == pytest.approx(0.5)


def test_wait_model_needs_data_and_an_idle_system_changes_nothing():
    assert model_waits([run()], ["hi"]) is None
    assert model_waits([run(started_at=1.0), run(started_at=1.0)], ["hi"]) is None
    idle = model_waits([run(started_at=float(i), wait_s=0.0) for i in range(5)], ["hi"])
    assert idle is not None and idle.utilisation == 0.0
    assert all(c.modelled_wait_s == 0.0 for c in idle.classes)
    assert effective_servers(0.0, 1.0, 1.0, 2.0) == float("inf")


def test_report_command_prints_every_section(app):
    store = app.aitp.store
    records = [run(task="a", predicted_runtime_s=1.2, started_at=float(i), wait_s=0.2 + i % 3)
               for i in range(30)]
    records += [run(arm="routed", routed=True, started_at=40.0 + i) for i in range(5)]
    records += [run(arm="standard", started_at=40.0 + i) for i in range(5)]
    store.append_records(store.keys.observations, records, 1000)
    out = CliRunner().invoke(aitp, ["report"], obj=SimpleNamespace(app=app))
    assert out.exit_code == 0, out.output
    for text in ("40 observed run(s)", "prediction error by task", "prediction error by tenant",
                 "would have gone to a tier queue", "modelled wait by tier", "arms (split)"):
        assert text in out.output, text
    as_json = CliRunner().invoke(aitp, ["report", "--json"], obj=SimpleNamespace(app=app))
    assert '"by_task"' in as_json.output and '"wait_model"' in as_json.output


def test_report_on_an_empty_store_says_there_is_nothing_yet(app):
    out = CliRunner().invoke(aitp, ["report", "--since", "60"], obj=SimpleNamespace(app=app))
    assert out.exit_code == 0, out.output
    assert "0 observed run(s)" in out.output and "no run carried a prediction" in out.output
