"""The guard: steps the split up while the routed arm passes, rolls back and says why."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from celery_aitp.errors import PolicyError
from celery_aitp.migration import guard_state
from celery_aitp.migration.control import StageControl, stage_doc
from celery_aitp.migration.guard import COMPLETED, PROMOTED, ROLLED_BACK, STOPPED, Guard, GuardError
from celery_aitp.policy import GuardSettings, SplitSettings, Stage, parse_policy
from celery_aitp.stubs import MemoryQueueOps
from celery_aitp.worker.janitor import Janitor
from tests.conftest import TEST_POLICY

SETTINGS = GuardSettings(steps=(10, 50, 100), interval_s=0.01, min_samples=5, failure_limit=2,
                         promote=True)


@pytest.fixture
def mw(app: Any) -> Any:
    mw = app.aitp
    mw.__dict__["settings"] = mw.settings.model_copy(update={"refresh_interval_s": 0.01})
    mw.store.write_stage(stage_doc(Stage.COEXISTENCE, SplitSettings()), "setup")
    return mw


@pytest.fixture
def ops() -> MemoryQueueOps:
    return MemoryQueueOps()


def make_guard(mw: Any, ops: MemoryQueueOps, lines: list[str], **changes: Any) -> Guard:
    settings = SETTINGS.model_copy(update=changes)
    control = StageControl(mw, Janitor(mw, ops=ops))
    return Guard(mw, settings, control=control, say=lines.append)


def feed(mw: Any, arm: str, n: int, wait_s: float, routed: bool | None = None,
         **fields: Any) -> None:
    """Observation records as workers write them, for ``n`` runs of one arm."""
    records = [{"task": "t", "tenant": "acme", "tier": "hi", "arm": arm,
                "routed": (arm == "routed") if routed is None else routed,
                "reason": "routed" if arm == "routed" else "split_standard_arm",
                "wait_s": wait_s, "runtime_s": 0.1, "outcome": "SUCCESS", **fields}
               for _ in range(n)]
    mw.store.append_records(mw.store.keys.observations, records, 10_000)


def stage_of(mw: Any) -> tuple[Stage, float]:
    stage, split, _ = StageControl(mw).read()
    return stage, split.percent


def test_guard_settings_are_validated_with_their_path():
    with pytest.raises(PolicyError, match=r"guard.steps: .*increase"):
        parse_policy({**TEST_POLICY, "guard": {"steps": [50, 10]}})
    with pytest.raises(PolicyError, match=r"guard.steps: .*\(0, 100\]"):
        parse_policy({**TEST_POLICY, "guard": {"steps": [0, 10]}})
    with pytest.raises(PolicyError, match=r"guard.conditions.min_sla_hit_rate"):
        parse_policy({**TEST_POLICY, "guard": {"conditions": {"min_sla_hit_rate": 2}}})
    with pytest.raises(PolicyError, match=r"guard.conditions.bogus"):
        parse_policy({**TEST_POLICY, "guard": {"conditions": {"bogus": 1}}})
    policy = parse_policy({**TEST_POLICY, "guard": {"steps": [1, 100], "failure_limit": 1}})
    assert policy.guard.steps == (1.0, 100.0) and policy.guard.failure_limit == 1


def test_a_routed_arm_that_misses_its_sla_is_rolled_back_with_the_reason(mw, ops):
    lines: list[str] = []
    guard = make_guard(mw, ops, lines)
    guard.start()
    assert stage_of(mw) == (Stage.SPLIT, 10)
    ops.queues["aitp.acme.cpu.hi"].extend((0.0, f"waiting-{i}") for i in range(4))
    for _ in range(2):  # two failed analyses: failure_limit
        feed(mw, "routed", 10, wait_s=5.0)  # SLA of tier hi is 1 s
        feed(mw, "standard", 10, wait_s=0.2)
        running = guard.step()
    assert not running and guard.state == ROLLED_BACK
    assert stage_of(mw)[0] is Stage.COEXISTENCE
    why = mw.store.stage_history(1)[0]["why"]
    assert "sla_hit_rate 0.0% < 95.0%" in why and "after 2 failed analyses" in why
    assert "wait p90 5 s > 1.5 x 0.2 s + 0.5 s" in why
    assert any("rolled back to coexistence" in line and "moved 4" in line for line in lines)
    assert not ops.queues["aitp.acme.cpu.hi"] and len(ops.queues["default-q"]) == 4
    state = guard_state.read_guard_state(mw.store)
    assert state is not None and state["state"] == ROLLED_BACK
    assert guard_state.acquire(mw.store, "next", 5)  # the lock was released


def test_a_passing_arm_is_promoted_step_by_step_to_takeover(mw, ops):
    guard = make_guard(mw, ops, [], watch_takeover=False)
    guard.start()
    seen = [stage_of(mw)]
    while guard.state == "running":
        feed(mw, "routed", 6, wait_s=0.1)
        feed(mw, "standard", 6, wait_s=0.3)
        guard.step()
        seen.append(stage_of(mw))
    assert guard.state == PROMOTED
    assert seen == [(Stage.SPLIT, 10), (Stage.SPLIT, 50), (Stage.SPLIT, 100),
                    (Stage.TAKEOVER, 100)]
    whos = {e["who"] for e in mw.store.stage_history(10)} - {"setup"}
    assert len(whos) == 1 and "(guard, pid" in whos.pop()


def test_without_promote_the_guard_stays_at_the_last_step(mw, ops):
    guard = make_guard(mw, ops, [], steps=(100.0,), promote=False)
    guard.start()
    feed(mw, "routed", 6, wait_s=0.1)
    assert not guard.step() and guard.state == COMPLETED
    assert stage_of(mw) == (Stage.SPLIT, 100)


def test_one_failure_below_the_limit_holds_the_step(mw, ops):
    lines: list[str] = []
    guard = make_guard(mw, ops, lines)
    guard.start()
    feed(mw, "routed", 10, wait_s=5.0)
    assert guard.step() and guard.failures == 1 and stage_of(mw) == (Stage.SPLIT, 10)
    assert "failed analyses: 1/2 (rollback at 2)" in lines[-1]


def test_too_few_routed_runs_is_inconclusive_and_changes_nothing(mw, ops):
    guard = make_guard(mw, ops, [])
    guard.start()
    feed(mw, "routed", 2, wait_s=5.0)  # would fail, but 2 < min_samples
    assert guard.step()
    assert guard.last is not None and guard.last.verdict == "inconclusive"
    assert guard.failures == 0 and stage_of(mw) == (Stage.SPLIT, 10)


def test_runs_of_inconclusive_analyses_count_towards_the_next_verdict(mw, ops):
    guard = make_guard(mw, ops, [])
    guard.start()
    for _ in range(2):
        feed(mw, "routed", 3, wait_s=0.1)  # 3 < min_samples 5
        guard.step()
        assert guard.last is not None
    assert guard.last.verdict == "pass" and guard.last.routed_runs == 6
    assert stage_of(mw) == (Stage.SPLIT, 50)


def test_starvation_fails_even_without_routed_runs(mw, ops):
    guard = make_guard(mw, ops, [], failure_limit=1)
    guard.start()
    import time

    ops.queues["aitp.acme.cpu.lo"].append((time.time() - 500, "stuck"))  # lo SLA 60 s
    assert not guard.step() and guard.state == ROLLED_BACK
    assert "oldest in aitp.acme.cpu.lo waited" in mw.store.stage_history(1)[0]["why"]


def test_fallbacks_on_the_routed_arm_fail_the_analysis(mw, ops):
    guard = make_guard(mw, ops, [], failure_limit=1)
    guard.start()
    feed(mw, "routed", 10, wait_s=0.1, routed=False)
    assert not guard.step()
    assert "fallback_rate 100.0% > 5.0%" in mw.store.stage_history(1)[0]["why"]


def test_a_change_by_hand_stops_the_guard_without_overwriting_it(mw, ops):
    lines: list[str] = []
    guard = make_guard(mw, ops, lines)
    guard.start()
    StageControl(mw).change(Stage.SPLIT, SplitSettings(percent=30), "alice@host (cli, pid 1)")
    feed(mw, "routed", 10, wait_s=0.1)
    assert not guard.step() and guard.state == STOPPED
    assert stage_of(mw) == (Stage.SPLIT, 30)
    assert "changed by alice@host" in lines[-1]


def test_dry_run_changes_nothing_and_says_what_it_would_do(mw, ops):
    lines: list[str] = []
    guard = make_guard(mw, ops, lines, failure_limit=1, dry_run=True)
    guard.start()
    feed(mw, "routed", 10, wait_s=5.0)
    assert not guard.step() and guard.state == ROLLED_BACK
    assert stage_of(mw)[0] is Stage.COEXISTENCE and len(mw.store.stage_history()) == 1
    assert guard_state.read_guard_state(mw.store) is None
    assert any(line.startswith("dry run: would set split 10%") for line in lines)
    assert "would roll back to coexistence" in lines[-1] and "sla_hit_rate" in lines[-1]


def test_the_guard_resumes_from_the_current_split_and_refuses_takeover(mw, ops):
    StageControl(mw).change(Stage.SPLIT, SplitSettings(percent=30, tenants=("acme",)), "me")
    guard = make_guard(mw, ops, [])
    guard.start()
    assert guard.index == 1 and stage_of(mw) == (Stage.SPLIT, 50)
    assert StageControl(mw).read()[1].tenants == ("acme",)  # selectors kept
    mw.store.write_stage(stage_doc(Stage.TAKEOVER, SplitSettings()), "me")
    with pytest.raises(GuardError, match="takeover already"):
        make_guard(mw, ops, [], watch_takeover=False).start()


def test_only_one_guard_runs_at_a_time(mw, ops):
    first = make_guard(mw, ops, [])
    first.start()
    with pytest.raises(GuardError, match="another guard"):
        make_guard(mw, ops, []).start()


def test_run_loops_until_done_and_a_stop_leaves_the_stage(mw, ops):
    guard = make_guard(mw, ops, [], interval_s=0.02)
    stop = threading.Event()
    timer = threading.Timer(0.15, stop.set)
    timer.start()
    assert guard.run(stop) == STOPPED
    assert stage_of(mw) == (Stage.SPLIT, 10)
    assert guard_state.read_guard_state(mw.store)["state"] == STOPPED  # type: ignore[index]


def test_status_shows_the_guard(app, mw, ops):
    from types import SimpleNamespace

    from click.testing import CliRunner

    from celery_aitp.cli.celery_command import aitp

    make_guard(mw, ops, []).start()
    mw.store.advertise("express@host", ["aitp.acme.cpu.hi"],
                       {"tenants": ["acme"], "tiers": ["hi"], "express": True}, 60)
    out = CliRunner().invoke(aitp, ["status"], obj=SimpleNamespace(app=app))
    assert out.exit_code == 0, out.output
    assert "guard: running" in out.output and "at 10% (step 1/3, failures 0/2)" in out.output
    assert "hi (express)" in out.output


# --- watching takeover ------------------------------------------------------------------

def feed_takeover(mw: Any, n: int, wait_s: float, **fields: Any) -> None:
    """Runs as workers record them in takeover: no arm, every task routed."""
    records = [{"task": "t", "tenant": "acme", "tier": "hi", "stage": "takeover",
                "routed": True, "reason": "routed", "wait_s": wait_s, "runtime_s": 0.1,
                "outcome": "SUCCESS", **fields} for _ in range(n)]
    mw.store.append_records(mw.store.keys.observations, records, 10_000)


def promoted(mw: Any, ops: MemoryQueueOps, lines: list[str], **changes: Any) -> Guard:
    guard = make_guard(mw, ops, lines, **changes)
    guard.start()
    while not guard.watching:
        feed(mw, "routed", 6, wait_s=0.1)
        feed(mw, "standard", 6, wait_s=0.3)
        assert guard.step()
    return guard


def test_after_promotion_the_guard_watches_takeover_against_the_split_baseline(mw, ops):
    lines: list[str] = []
    guard = promoted(mw, ops, lines)
    assert guard.state == "running" and stage_of(mw)[0] is Stage.TAKEOVER
    assert guard.baseline is not None and guard.baseline.n == 6  # the 50% step's control
    assert any("watching it against the baseline of 6 control runs" in x for x in lines)
    feed(mw, "routed", 6, wait_s=0.1)  # left-over split runs are not takeover's
    feed_takeover(mw, 6, wait_s=0.2)
    assert guard.step() and stage_of(mw)[0] is Stage.TAKEOVER
    assert guard.last is not None and guard.last.verdict == "pass"
    assert guard.last.routed_runs == 6 and guard.last.control_runs == 6
    assert "wait p90 0.2 s <= 1.5 x 0.3 s + 0.5 s" in guard.last.summary
    state = guard_state.read_guard_state(mw.store)
    assert state is not None and state["watching"] == "takeover"
    assert state["baseline"]["runs"] == 6
    assert "watching takeover (failures 0/2, baseline 6 control runs)" in \
        guard_state.describe_guard(state)


def test_a_failing_takeover_steps_back_to_split_audited_and_is_not_promoted_again(mw, ops):
    lines: list[str] = []
    guard = promoted(mw, ops, lines)
    for _ in range(2):  # failure_limit analyses, each missing hi's 1 s SLA
        feed_takeover(mw, 6, wait_s=3.0)
        assert guard.step()
    assert stage_of(mw) == (Stage.SPLIT, 50)  # the last step below 100%
    entry = mw.store.stage_history(1)[0]
    assert "(guard, pid" in entry["who"] and entry["old"]["stage"] == "takeover"
    assert "step back from takeover to split 50% after 2 failed analyses" in entry["why"]
    assert "sla_hit_rate 0.0% < 95.0%" in entry["why"]
    assert "wait p90 3 s > 1.5 x 0.3 s + 0.5 s" in entry["why"]
    assert not guard.watching and guard.state == "running"
    while guard.state == "running":  # the split passes again: it stays in split
        feed(mw, "routed", 6, wait_s=0.1)
        feed(mw, "standard", 6, wait_s=0.3)
        guard.step()
    assert guard.state == COMPLETED and stage_of(mw) == (Stage.SPLIT, 100)
    assert "not promoting again" in lines[-1]


def test_started_in_takeover_it_watches_and_can_roll_back_to_coexistence(mw, ops):
    mw.store.write_stage(stage_doc(Stage.TAKEOVER, SplitSettings()), "me")
    lines: list[str] = []
    guard = make_guard(mw, ops, lines, takeover_step_back="coexistence")
    guard.start()
    assert guard.watching and "no split baseline" in lines[0]
    now = time.time()  # fresh messages: the starvation check passes
    ops.queues["aitp.acme.cpu.hi"].extend((now, f"waiting-{i}") for i in range(3))
    for _ in range(2):
        feed_takeover(mw, 6, wait_s=0.2, routed=False, reason="no_live_worker")
        running = guard.step()
    assert guard.last is not None and [c.name for c in guard.last.failed] == ["fallback_rate"]
    assert "wait not checked (0 control runs)" in [c.detail for c in guard.last.checks]
    assert not running and guard.state == ROLLED_BACK
    assert stage_of(mw)[0] is Stage.COEXISTENCE
    why = mw.store.stage_history(1)[0]["why"]
    assert "rollback after 2 failed analyses in takeover" in why
    assert "fallback_rate 100.0% > 5.0%" in why
    assert len(ops.queues["default-q"]) == 3  # drained, nothing lost


def test_a_guard_started_in_takeover_uses_the_last_guards_baseline(mw, ops):
    first = promoted(mw, ops, [])
    first._finish(STOPPED, "stopped by the test")
    first._save()  # keeps the baseline in the store, releases the lock
    lines: list[str] = []
    second = make_guard(mw, ops, lines)
    second.start()
    assert second.watching and second.baseline is not None
    assert (second.baseline.n, second.baseline.wait(0.9)) == (6, pytest.approx(0.3))
    assert "against the last guard's baseline of 6 control runs" in lines[0]
    feed_takeover(mw, 6, wait_s=3.0)
    second.step()
    assert "wait p90 3 s > 1.5 x 0.3 s + 0.5 s" in second.last.summary  # type: ignore[union-attr]


@pytest.mark.parametrize("bad", [None, "x", {"runs": 3}, {"runs": 3, "failures": 5,
                                                          "waits": [0.1]},
                                 {"runs": 3, "failures": 0, "waits": []},
                                 {"runs": 3, "failures": 0, "waits": [0.1, "slow"]},
                                 {"runs": 3, "failures": 0, "waits": [float("nan")]}])
def test_a_malformed_saved_baseline_is_no_baseline(bad):
    assert guard_state.baseline_of(bad) is None
