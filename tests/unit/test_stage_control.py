"""Switching the live stage: audit log, split validation, rollback that drains tier queues."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from celery_aitp.cli.celery_command import aitp
from celery_aitp.errors import PolicyError, StageConflict
from celery_aitp.migration.control import StageControl, stage_doc, who_am_i
from celery_aitp.policy import SplitSettings, Stage
from celery_aitp.stubs import MemoryQueueOps
from celery_aitp.worker.janitor import Janitor


@pytest.fixture
def fast(app: Any) -> Any:
    """The unit app's middleware with a short refresh interval (short rollback settle)."""
    mw = app.aitp
    mw.__dict__["settings"] = mw.settings.model_copy(update={"refresh_interval_s": 0.02})
    return mw


@pytest.fixture
def ops() -> MemoryQueueOps:
    ops = MemoryQueueOps()
    for i in range(5):
        ops.queues["aitp.acme.cpu.hi"].append((float(i), f"hi-{i}"))
    for i in range(3):
        ops.queues["aitp.globex.gpu.mid"].append((float(i), f"mid-{i}"))
    ops.queues["default-q"].append((0.0, "old"))
    return ops


def cli(app: Any, *args: str) -> Any:
    result = CliRunner().invoke(aitp, list(args), obj=SimpleNamespace(app=app))
    return result


def test_change_is_audited_with_who_why_old_and_new(fast):
    control = StageControl(fast, Janitor(fast, ops=MemoryQueueOps()))
    control.change(Stage.SPLIT, SplitSettings(percent=10), "alice@h (cli, pid 1)", "try 10%")
    control.change(Stage.TAKEOVER, None, "bob@h (cli, pid 2)")
    latest, first = fast.store.stage_history(2)
    assert first["who"] == "alice@h (cli, pid 1)" and first["why"] == "try 10%"
    assert first["old"] is None and first["new"]["split"]["percent"] == 10
    assert latest["old"]["stage"] == "split" and latest["new"]["stage"] == "takeover"
    assert latest["new"]["split"]["percent"] == 10  # split kept for a later return to split
    assert control.read()[0] is Stage.TAKEOVER


def test_split_selectors_must_name_known_tenants_and_tiers(fast):
    control = StageControl(fast, Janitor(fast, ops=MemoryQueueOps()))
    with pytest.raises(PolicyError, match=r"unknown tenant 'initech'.*unknown tier 'gold'"):
        control.change(Stage.SPLIT, SplitSettings(percent=5, tenants=("initech",),
                                                  tiers=("gold",)), "me")
    assert fast.store.read_stage() is None  # nothing written


def test_compare_and_set_refuses_when_someone_changed_the_stage(fast):
    control = StageControl(fast, Janitor(fast, ops=MemoryQueueOps()))
    seen = stage_doc(Stage.SPLIT, SplitSettings(percent=5))
    control.change(Stage.SPLIT, SplitSettings(percent=5), "guard")
    control.change(Stage.SPLIT, SplitSettings(percent=50), "human")
    with pytest.raises(StageConflict):
        control.change(Stage.SPLIT, SplitSettings(percent=10), "guard", expect=seen)
    assert control.read()[1].percent == 50


def test_rollback_moves_every_tier_queue_message_to_the_default_queue(fast, ops):
    control = StageControl(fast, Janitor(fast, ops=ops))
    control.change(Stage.TAKEOVER, None, "me")
    change = control.rollback("me", "SLA missed", settle_s=0)
    assert change.moved == {"aitp.acme.cpu.hi": 5, "aitp.globex.gpu.mid": 3}
    assert change.moved_total == 8
    assert [m for _, m in ops.queues["default-q"]][0] == "old"
    assert sorted(m for _, m in ops.queues["default-q"]) == sorted(
        ["old"] + [f"hi-{i}" for i in range(5)] + [f"mid-{i}" for i in range(3)])
    assert not any(ops.queues[q] for q in ops.queues if q.startswith("aitp."))
    assert fast.store.stage_history(1)[0]["why"] == "SLA missed"


def test_rollback_keeps_draining_for_the_settle_time(fast):
    ops = MemoryQueueOps()
    calls = []

    class LateArrivals(Janitor):
        def evacuate(self, queues: Any) -> dict[str, int]:
            calls.append(1)
            if len(calls) == 2:  # a producer that had not refreshed yet routes one more
                ops.queues["aitp.acme.cpu.hi"].append((0.0, "late"))
            return super().evacuate(queues)

    control = StageControl(fast, LateArrivals(fast, ops=ops))
    change = control.rollback("me", "test", settle_s=0.6)
    assert len(calls) >= 3 and change.moved == {"aitp.acme.cpu.hi": 1}
    assert not ops.queues["aitp.acme.cpu.hi"]


def test_janitor_drains_live_tier_queues_too_in_coexistence(fast, ops, store):
    store.advertise("w1", ["aitp.acme.cpu.hi", "aitp.globex.gpu.mid"], {}, ttl_s=60)
    janitor = Janitor(fast, ops=ops)
    store.write_stage(stage_doc(Stage.TAKEOVER, SplitSettings()), "me")
    assert janitor.sweep() == {}  # served queues are left alone in takeover
    store.write_stage(stage_doc(Stage.COEXISTENCE, SplitSettings()), "me")
    assert janitor.sweep() == {"aitp.acme.cpu.hi": 5, "aitp.globex.gpu.mid": 3}


def test_who_am_i_names_user_host_channel_and_pid():
    who = who_am_i("cli")
    assert "@" in who and "(cli, pid " in who


def test_stage_command_switches_and_shows(app, fast):
    out = cli(app, "stage", "split", "--percent", "30", "--select", "tenant=acme,globex",
              "--select", "task=billing.*", "--reason", "first canary")
    assert out.exit_code == 0, out.output
    assert "split 30% of tenant=acme,globex task=billing.*" in out.output
    assert "was (policy default)" in out.output
    split = StageControl(fast).read()[1]
    assert split.tenants == ("acme", "globex") and split.tasks == ("billing.*",)
    out = cli(app, "stage", "split", "--percent", "50")  # selectors kept
    assert "split 50% of tenant=acme,globex task=billing.*" in out.output
    out = cli(app, "stage", "split", "--select", "all")
    assert "stage: split 50%" in out.output and "tenant" not in out.output.split("(was")[0]
    out = cli(app, "stage")
    assert out.exit_code == 0 and "stage: split 50%" in out.output


def test_stage_command_rejects_bad_input_with_the_reason(app, fast):
    bad_key = cli(app, "stage", "split", "--select", "colour=red")
    assert bad_key.exit_code == 2 and "KEY one of tenant, task, tier" in bad_key.output
    bad_percent = cli(app, "stage", "split", "--percent", "130")
    assert bad_percent.exit_code == 2 and "percent" in bad_percent.output
    unknown = cli(app, "stage", "split", "--select", "tenant=initech")
    assert unknown.exit_code == 2 and "unknown tenant 'initech'" in unknown.output
    bad_stage = cli(app, "stage", "warp")
    assert bad_stage.exit_code == 2
    assert fast.store.read_stage() is None


def test_stage_coexistence_reports_the_drain(app, fast):
    out = cli(app, "stage", "coexistence", "--reason", "rollback drill")
    assert out.exit_code == 0, out.output
    assert "moved 0 waiting message(s) from tier queues to default-q" in out.output


def test_two_operators_editing_the_split_at_once_both_land(app, fast, monkeypatch):
    """The CLI read the split, then wrote its edit over whatever had landed meanwhile:
    'split --percent 50' and 'split --select tenant=acme' at the same instant lost one."""
    cli(app, "stage", "split", "--percent", "10")
    real_read = StageControl.read
    landed = []

    def read_then_another_lands(self: StageControl) -> Any:
        found = real_read(self)
        if not landed:  # the other operator's change, between this read and the write
            landed.append(True)
            self.middleware.store.write_stage(
                {"stage": "split", "split": {"percent": 50}}, who="other")
        return found

    monkeypatch.setattr(StageControl, "read", read_then_another_lands)
    out = cli(app, "stage", "split", "--select", "tenant=acme")
    assert out.exit_code == 0, out.output
    split = fast.store.read_stage()["split"]
    assert split["percent"] == 50 and split["tenants"] == ["acme"]


def test_history_and_status_show_the_changes(app, fast):
    never = " ".join(cli(app, "status").output.split())  # lines folded
    assert "never recorded" in never and "set the stage again" in never
    cli(app, "stage", "split", "--percent", "5", "--reason", "canary")
    cli(app, "stage", "takeover")
    out = cli(app, "history")
    assert out.exit_code == 0, out.output
    assert out.output.index("takeover") < out.output.index("canary")  # newest first
    assert "(cli, pid" in out.output and "(policy default)" in out.output
    status = cli(app, "status")
    assert status.exit_code == 0, status.output
    assert "stage: takeover" in status.output and "(cli, pid" in status.output
    as_json = cli(app, "history", "--json")
    assert '"why": "canary"' in as_json.output


def test_a_rollback_from_the_dashboard_drains_the_tier_queues(app, fast, ops):
    from starlette.testclient import TestClient

    from celery_aitp.dashboard.app import build_dashboard, create_app
    from celery_aitp.dashboard.config import DashboardConfig

    dashboard = build_dashboard(fast, DashboardConfig(allowed_hosts=("testserver",)))
    assert dashboard.drain is not None  # wired to the migration rollback
    control = StageControl(fast, Janitor(fast, ops=ops))
    dashboard.drain = lambda: control.drain(0)
    client = TestClient(create_app(dashboard))
    client.get("/stage")
    response = client.post("/api/stage", json={"stage": "coexistence"}, headers={
        "X-AITP-CSRF": client.cookies["aitp_csrf"], "Origin": "http://testserver"})
    assert response.status_code == 200, response.text
    assert response.json()["moved"] == {"aitp.acme.cpu.hi": 5, "aitp.globex.gpu.mid": 3}
    assert not any(ops.queues[q] for q in ops.queues if q.startswith("aitp."))


def test_janitor_drains_the_queues_of_a_tenant_taken_out_of_the_policy(app, fast, store):
    """A tenant removed by ``policy apply``: nothing routes to or reads its queues any more,
    yet messages from before the change wait there (and runs under way come back)."""
    from celery_aitp.policy import parse_policy
    from celery_aitp.policy_live import apply_policy
    from tests.conftest import TEST_POLICY

    fast.live.flush()  # the app's own policy: the first version in the history
    tenants = {k: v for k, v in TEST_POLICY["tenants"].items() if k != "globex"}
    without_globex = parse_policy({**TEST_POLICY, "tenants": tenants})
    apply_policy(store, without_globex, fast.policy, source="test", reason="globex left")
    fast.adopt_policy(without_globex, "test")
    ops = MemoryQueueOps()
    ops.queues["aitp.globex.cpu.lo"].extend([(0.0, "a"), (1.0, "b")])
    store.write_stage(stage_doc(Stage.TAKEOVER, SplitSettings()), "me")
    janitor = Janitor(fast, ops=ops)
    assert "aitp.globex.cpu.lo" not in janitor.known_queues()
    store.advertise("old", ["aitp.globex.cpu.lo"], {}, ttl_s=60)
    assert janitor.sweep() == {}  # a worker still on the old policy reads it
    store.withdraw("old")
    assert janitor.sweep() == {"aitp.globex.cpu.lo": 2}
    ops.queues["aitp.globex.cpu.lo"].append((2.0, "c"))  # a run under way came back
    assert janitor.sweep() == {"aitp.globex.cpu.lo": 1}  # looked at on every pass
    assert [m for _, m in ops.queues["default-q"]] == ["a", "b", "c"]
    assert "aitp.globex.gpu.hi" in janitor.every_queue()  # evacuate --all drains it too


def test_evacuate_refuses_a_queue_that_is_not_a_tier_queue(app, fast):
    out = cli(app, "evacuate", "--queue", "reports", "--queue", "aitp.acme.cpu.hi")
    assert out.exit_code == 2
    assert "not a tier queue: reports" in out.output and "aitp.acme" not in out.output


def test_many_retired_queues_are_looked_at_in_turn(app, fast, store):
    from celery_aitp.policy import parse_policy
    from celery_aitp.policy_live import apply_policy
    from tests.conftest import TEST_POLICY

    many = {f"t{i}": {} for i in range(30)}
    wide = parse_policy({**TEST_POLICY, "tenants": {**TEST_POLICY["tenants"], **many}})
    apply_policy(store, wide, fast.policy, source="test", reason="30 tenants, 6 queues each")
    apply_policy(store, parse_policy(TEST_POLICY), wide, source="test", reason="gone")
    fast.adopt_policy(parse_policy(TEST_POLICY), "test")
    janitor = Janitor(fast, ops=MemoryQueueOps())
    janitor.FORMER_PER_PASS = 50
    retired = janitor.retired_queues()
    assert len(retired) == 180
    seen = [q for _ in range(4) for q in janitor._retired_batch()]
    assert len(seen) == 200 and set(seen) == set(retired)  # 50 a pass, each in turn


def test_evacuate_takes_a_logical_tier_queue_name_on_rabbitmq_too(app, fast, monkeypatch):
    """On RabbitMQ one broker queue holds every tier of a tenant and accelerator; the
    logical name (as dashboards and advertisements show it) is what an operator types."""
    from celery_aitp.layout import PerTenantLayout

    fast.__dict__["layout"] = PerTenantLayout(fast.policy.tier_names)
    moved: list[Any] = []
    monkeypatch.setattr(Janitor, "evacuate", lambda self, queues: moved.append(queues) or {})
    out = cli(app, "evacuate", "--queue", "aitp.acme.cpu.hi", "--queue", "aitp.acme.cpu")
    assert out.exit_code == 0, out.output
    assert moved == [("aitp.acme.cpu.hi", "aitp.acme.cpu")]


def test_a_split_may_select_a_tenant_nobody_lists_when_the_policy_takes_them():
    """A canary of one customer among thousands of unlisted ones; a class is refused with
    the reason (its tenants carry their own names)."""
    from celery_aitp.migration.control import check_split
    from celery_aitp.policy import parse_policy
    from tests.conftest import TEST_POLICY

    open_policy = parse_policy({**TEST_POLICY, "tenant_classes": {"std": {}},
                                "unlisted_tenants": "std"})
    canary = SplitSettings(percent=100, tenants=("cust001",))
    assert check_split(canary, open_policy) == canary
    with pytest.raises(PolicyError, match="unknown tenant 'cust001'"):
        check_split(canary, parse_policy(TEST_POLICY))  # the policy takes none
    with pytest.raises(PolicyError, match="a tenant class is not a tenant"):
        check_split(SplitSettings(percent=5, tenants=("std",)), open_policy)
    assert parse_policy({**TEST_POLICY, "tenant_classes": {"std": {}},
                         "unlisted_tenants": "std", "split": {"tenants": ["cust001"]}})


def _apply_initech(store: Any, policy: Any) -> None:
    from celery_aitp.policy import parse_policy
    from celery_aitp.policy_live import apply_policy
    from tests.conftest import TEST_POLICY

    with_initech = {**TEST_POLICY, "tenants": {**TEST_POLICY["tenants"], "initech": {}}}
    apply_policy(store, parse_policy(with_initech), policy, source="test", reason="new")


def test_stage_split_knows_a_tenant_the_applied_policy_added(app, fast, store):
    """The command line, run with the app's own file, refused ``--select tenant=initech``
    for a tenant added by ``policy apply``."""
    _apply_initech(store, fast.policy)
    out = cli(app, "stage", "split", "--percent", "10", "--select", "tenant=initech")
    assert out.exit_code == 0, out.output
    assert StageControl(fast).read()[1].tenants == ("initech",)


def test_stage_coexistence_drains_the_queues_of_a_tenant_the_applied_policy_added(
        app, fast, store, monkeypatch):
    """It drained the tier queues of the app's own file: initech's waited for a
    worker's janitor."""
    _apply_initech(store, fast.policy)
    ops = MemoryQueueOps()
    ops.queues["aitp.acme.cpu.hi"].extend((float(i), f"acme-{i}") for i in range(25))
    ops.queues["aitp.initech.cpu.lo"].extend((float(i), f"initech-{i}") for i in range(18))
    monkeypatch.setattr("celery_aitp.worker.janitor.queue_ops_for", lambda app: ops)
    out = cli(app, "stage", "coexistence", "--reason", "rollback drill")
    assert out.exit_code == 0, out.output
    assert "moved 43 waiting message(s)" in out.output
    assert not ops.queues["aitp.initech.cpu.lo"]


def test_the_dashboard_follows_the_applied_policy(app, fast, store):
    from starlette.testclient import TestClient

    from celery_aitp.dashboard.app import build_dashboard, create_app
    from celery_aitp.dashboard.config import DashboardConfig
    from celery_aitp.policy import parse_policy
    from celery_aitp.policy_live import apply_policy
    from tests.conftest import TEST_POLICY

    def add(tenant: str) -> None:
        tenants = {**fast.policy.model_dump(mode="json")["tenants"], tenant: {}}
        apply_policy(store, parse_policy({**TEST_POLICY, "tenants": tenants}), fast.policy,
                     source="test", reason=f"{tenant} signed")

    add("initech")  # before the dashboard starts
    dashboard = build_dashboard(fast, DashboardConfig(allowed_hosts=("testserver",)))
    dashboard.drain = None
    client = TestClient(create_app(dashboard))
    client.get("/stage")
    headers = {"X-AITP-CSRF": client.cookies["aitp_csrf"], "Origin": "http://testserver"}

    def select(tenant: str) -> Any:
        return client.post("/api/stage", headers=headers, json={
            "stage": "split", "split": {"percent": 10, "tenants": [tenant]}})

    assert select("initech").status_code == 200, select("initech").text
    add("hooli")  # while it runs: a stage change sees it at once
    assert select("hooli").status_code == 200, select("hooli").text
    add("umbrella")  # and the pages on their next refresh
    dashboard.fleet.snapshot(max_age_s=0)
    assert "umbrella" in client.get("/api/stage").json()["tenants"]
    assert "aitp.umbrella.cpu.lo" in dashboard.fleet.known_queues
