"""Migration stages with real processes on real Redis: live switch, arms, rollback, guard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import pytest
from celery import chain

from celery_aitp.migration.control import StageControl, stage_doc
from celery_aitp.policy import SplitSettings, Stage
from celery_aitp.publish.split import split_bucket
from celery_aitp.worker.janitor import Janitor
from tests.conftest import TEST_POLICY
from tests.support.live import running_producer, wait_live
from tests.support.workers import ROOT

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``celery -A tests.apps.proj aitp ...`` in its own process (another shell)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "celery", "-A", "tests.apps.proj", "aitp",
                           *args], env=env, cwd=str(ROOT), capture_output=True, text=True,
                          timeout=timeout, check=False)


def set_stage(proj: Any, stage: Stage, percent: float = 0) -> None:
    proj.app.aitp.store.write_stage(stage_doc(stage, SplitSettings(percent=percent)), "test")
    proj.app.aitp.live.refresh()


def observations(proj: Any) -> list[dict[str, Any]]:
    store = proj.app.aitp.store
    return store.read_records(store.keys.observations)


def test_a_stage_change_reaches_a_running_producer_and_prefork_children_in_2s(
        proj, start_worker, monkeypatch):
    monkeypatch.setenv("AITP_TEST_REFRESH_INTERVAL", "1.0")  # the default interval
    set_stage(proj, Stage.COEXISTENCE)
    start_worker("prefork", "--aitp-tenant", "*", concurrency=2)
    with running_producer() as published:
        warm = [proj.probe.delay(0.3) for _ in range(4)]
        assert {r.get(timeout=20)["stage"] for r in warm} == {"coexistence"}
        changed = cli("stage", "split", "--percent", "30", "--reason", "live switch test")
        assert changed.returncode == 0, changed.stderr
        at = proj.app.aitp.store.stage_history(1)[0]["at"]
        probes: list[dict[str, Any]] = []
        while time.time() < at + 3.5:
            probes += [r.get(timeout=20) for r in [proj.probe.delay(0.2) for _ in range(2)]]
        steps = chain(proj.where.si(1), proj.where.si(2)).apply_async()
        step_two = steps.get(timeout=20)
    late = [p for p in probes if p["at"] > at + 2]
    assert len({p["pid"] for p in late}) == 2  # both pool children ran probes after 2 s...
    assert {p["stage"] for p in late} == {"split"}  # ...and both had followed
    assert step_two["aitp"]["stage"] == "split"  # a chain step a child published
    before = [s for t, s, _ in published if float(t) < at]
    after = [s for t, s, _ in published if float(t) > at + 2]
    assert before and set(before) == {"coexistence"}
    assert after and set(after) == {"split"}
    lag = max(float(t) for t, s, _ in published if s == "coexistence") - at
    child_lag = max([p["at"] for p in probes if p["stage"] == "coexistence"], default=at) - at
    print(f"followed after: producer {lag:.2f} s, pool children {child_lag:.2f} s")


def test_chain_steps_and_retries_keep_their_arm(proj, start_worker):
    set_stage(proj, Stage.SPLIT, 50)
    start_worker("tiers", "--aitp-tenant", "*", concurrency=2)
    wait_live(proj, "aitp.default.cpu.lo")
    chains = [chain(proj.where.si(i), proj.where.si(i), proj.where.si(i)).apply_async()
              for i in range(16)]
    retried = [proj.flaky.delay(i) for i in range(8)]
    default = proj.app.conf.task_default_queue
    arms = []
    for result in chains:
        steps = [result.parent.parent.get(timeout=30), result.parent.get(timeout=30),
                 result.get(timeout=30)]
        assert len({s["aitp"]["arm"] for s in steps}) == 1, steps
        arm = steps[0]["aitp"]["arm"]
        arms.append(arm)
        assert all((s["queue"] != default) == (arm == "routed") for s in steps), steps
    assert set(arms) == {"routed", "standard"}
    finals = {r.id: r.get(timeout=30) for r in retried}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # each retried task: two runs observed
        runs = [o for o in observations(proj) if o["task_id"] in finals]
        if len(runs) == 2 * len(finals):
            break
        time.sleep(0.2)
    assert len(runs) == 2 * len(finals)
    for task_id, final in finals.items():
        assert {o["arm"] for o in runs if o["task_id"] == task_id} == {final["aitp"]["arm"]}


def where_are(proj: Any, ids: list[str], workers: list[Any], ran: int) -> str:
    """Where the tasks that did not run are: a queue, unacknowledged, or failed in a log."""
    client, prefix = proj.tally_client(), proj.PREFIX
    done = {m.decode() for m in client.smembers(f"{prefix}:tally:ids")}
    missing = [i for i in ids if i not in done]
    lines = [f"{ran} of {len(ids)} ran; missing: {missing[:20]}"]
    keys = [k.decode() for k in client.scan_iter("*", count=1000)]
    for task_id in missing[:20]:
        places = [k for k in keys if client.type(k) == b"list"
                  and any(task_id.encode() in m for m in client.lrange(k, 0, -1))]
        if any(task_id.encode() in v for v in client.hvals("unacked")):
            places.append("unacked")
        logs = [w.name for w in workers if task_id in w.output()]
        lines.append(f"{task_id}: in {places or 'no queue'}; in logs of {logs or 'no worker'}")
    for w in workers:
        errors = [ln for ln in w.output().splitlines() if "ERROR" in ln or "Traceback" in ln]
        lines.append(f"--- {w.name}: {len(errors)} error line(s)\n" + "\n".join(errors[:20]))
    return "\n".join(lines)


def tier_depths(proj: Any) -> dict[str, int]:
    janitor = Janitor(proj.app.aitp)
    return janitor.ops.depths([*janitor.known_queues(), proj.app.conf.task_default_queue])


def test_flipping_stages_while_5000_tasks_flow_runs_each_exactly_once(proj, start_worker):
    total = 5000
    set_stage(proj, Stage.COEXISTENCE)
    workers = [start_worker("tiers", "--aitp-tenant", "*", pool="threads", concurrency=2),
               start_worker("plain", pool="threads", concurrency=8)]
    wait_live(proj, "aitp.acme.cpu.hi")
    control = StageControl(proj.app.aitp)
    published = 0
    ids: list[str] = []
    tenants = ({"aitp_tenant": "acme"}, {"aitp_tenant": "globex"}, {})

    def publish() -> None:
        nonlocal published
        started = time.monotonic()
        for i in range(total):
            ids.append(proj.tally.apply_async((i,), headers=tenants[i % 3]).id)
            published = i + 1
            ahead = started + (i + 1) / 1000 - time.monotonic()  # about 1,000 per second
            if ahead > 0:
                time.sleep(ahead)

    thread = threading.Thread(target=publish)
    thread.start()
    plan = [(1000, Stage.SPLIT), (2500, Stage.TAKEOVER), (4000, Stage.COEXISTENCE)]
    moved = 0
    for at, stage in plan:
        while published < at:
            time.sleep(0.01)
        split = SplitSettings(percent=50)
        moved += control.change(stage, split, "flip test", f"flip at {at}").moved_total
    thread.join()
    client, prefix = proj.tally_client(), proj.PREFIX
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and client.scard(f"{prefix}:tally:ids") < total:
        time.sleep(0.2)
    time.sleep(1.0)  # a duplicate would show up now
    deliveries = {k.decode(): int(v)
                  for k, v in client.hgetall(f"{prefix}:tally:deliveries").items()}
    duplicated = sorted(k for k, v in deliveries.items() if v > 1)
    queues = {k.decode(): int(v) for k, v in client.hgetall(f"{prefix}:tally:queues").items()}
    print(f"moved at rollback: {moved}; runs by queue: {queues}")
    ran = client.scard(f"{prefix}:tally:ids")
    assert ran == total, where_are(proj, ids, workers, ran)
    assert not duplicated, f"delivered more than once: {duplicated[:20]}"
    assert not any(tier_depths(proj).values())
    default = proj.app.conf.task_default_queue
    assert queues.get(default, 0) > 0 and sum(v for k, v in queues.items() if k != default) > 0
    assert [e["new"]["stage"] for e in proj.app.aitp.store.stage_history(3)] == [
        "coexistence", "takeover", "split"]


GUARDED = {
    **TEST_POLICY,
    "guard": {"steps": [50, 100], "interval_s": 1, "min_samples": 3, "failure_limit": 1,
              "conditions": {"min_sla_hit_rate": 0.9, "max_queue_age_sla": None}},
}


@pytest.fixture
def guarded(deployment: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("AITP_TEST_POLICY", json.dumps(GUARDED))
    return deployment


def ids_on_arm(routed: bool, n: int) -> list[str]:
    """Task ids the 50% split puts on the wanted arm (the bucket is deterministic)."""
    ids: list[str] = []
    while len(ids) < n:
        task_id = str(uuid.uuid4())
        if (split_bucket(task_id) < 50) == routed:
            ids.append(task_id)
    return ids


def start_guard() -> subprocess.Popen[str]:
    """``celery aitp guard`` in its own process (its output in ``stdout``)."""
    return subprocess.Popen([sys.executable, "-m", "celery", "-A", "tests.apps.proj", "aitp",
                             "guard"], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def test_the_guard_rolls_back_a_routed_arm_that_misses_its_sla(guarded, proj, start_worker):
    set_stage(proj, Stage.COEXISTENCE)
    start_worker("slow", "--aitp-tenant", "acme", "--aitp-no-default-queue")  # one process
    start_worker("plain", pool="threads", concurrency=6)
    wait_live(proj, "aitp.acme.cpu.hi")
    guard = start_guard()
    try:
        store = proj.app.aitp.store
        deadline = time.monotonic() + 20
        while (store.read_stage() or {}).get("stage") != "split" and time.monotonic() < deadline:
            time.sleep(0.1)
        proj.app.aitp.live.refresh()
        headers = {"aitp_tenant": "acme"}
        results = [proj.hi.apply_async((i, 1.0), headers=headers, task_id=task_id)
                   for i, task_id in enumerate(ids_on_arm(True, 6) + ids_on_arm(False, 6))]
        output, _ = guard.communicate(timeout=60)
    finally:
        if guard.poll() is None:
            guard.kill()
            guard.wait()
    print(output)
    assert guard.returncode == 1, output
    assert "rolled back to coexistence" in output and "sla_hit_rate" in output, output
    last = store.stage_history(1)[0]
    assert last["new"]["stage"] == "coexistence" and "(guard, pid" in last["who"]
    assert "sla_hit_rate" in last["why"] and "< 90.0%" in last["why"]
    assert sorted(r.get(timeout=30)["x"] for r in results) == list(range(12))  # none lost
    assert not any(tier_depths(proj).values())
    status = cli("status")
    assert "guard: rolled_back" in status.stdout, status.stdout


WATCHING = {**GUARDED, "guard": {**GUARDED["guard"], "promote": True, "watch_takeover": True}}


def test_the_guard_steps_a_failing_takeover_back_to_split(deployment, monkeypatch, proj,
                                                          start_worker):
    monkeypatch.setenv("AITP_TEST_POLICY", json.dumps(WATCHING))
    set_stage(proj, Stage.TAKEOVER)
    start_worker("slow", "--aitp-tenant", "acme", "--aitp-no-default-queue")  # one process
    start_worker("plain", pool="threads", concurrency=6)
    wait_live(proj, "aitp.acme.cpu.hi")
    guard = start_guard()
    store = proj.app.aitp.store
    try:
        deadline = time.monotonic() + 20
        while guard_state_of(store) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        headers = {"aitp_tenant": "acme"}  # 1 s each on one process: hi's 1 s SLA missed
        results = [proj.hi.apply_async((i, 1.0), headers=headers) for i in range(6)]
        deadline = time.monotonic() + 60
        while (store.read_stage() or {}).get("stage") != "split":
            assert time.monotonic() < deadline, "the guard never stepped back"
            assert guard.poll() is None, guard.communicate()[0]
            time.sleep(0.2)
    finally:
        guard.terminate()  # it keeps watching the split: SIGTERM stops it (exit 3)
        output, _ = guard.communicate(timeout=30)
    print(output)
    assert "watching takeover" in output and "stepped back to split at 50%" in output, output
    last = store.stage_history(1)[0]
    assert last["old"]["stage"] == "takeover" and last["new"]["stage"] == "split"
    assert last["new"]["split"]["percent"] == 50 and "(guard, pid" in last["who"]
    assert "step back from takeover" in last["why"] and "sla_hit_rate" in last["why"]
    assert sorted(r.get(timeout=30)["x"] for r in results) == list(range(6))  # none lost


def guard_state_of(store: Any) -> Any:
    from celery_aitp.migration import guard_state

    return guard_state.read_guard_state(store)
