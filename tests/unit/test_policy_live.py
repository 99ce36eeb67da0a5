"""The live policy: apply, diff, rollback and history; every process follows the applied one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import yaml
from celery import Celery
from click.testing import CliRunner

import celery_aitp
from celery_aitp.cli.celery_command import aitp
from celery_aitp.errors import PolicyError
from celery_aitp.policy import parse_policy
from celery_aitp.policy_history import policy_digest, policy_history
from celery_aitp.policy_live import active_policy, apply_policy, read_active
from tests.conftest import TEST_POLICY
from tests.support.live import wait_for
from tests.unit.conftest import make_live

#: TEST_POLICY with globex allowed up to hi (it is capped at mid in TEST_POLICY).
GLOBEX_HI = {**TEST_POLICY, "tenants": {**TEST_POLICY["tenants"],
                                        "globex": {"max_tier": "hi"}}}


def cli(app: Any, *args: str) -> Any:
    return CliRunner().invoke(aitp, list(args), obj=type("Ctx", (), {"app": app})())


def policy_file(tmp_path: Any, doc: dict[str, Any], name: str = "policy.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def tier_of_urgent(app: Any, tenant: str) -> str:
    """Publish the task declaring tier hi for ``tenant``; the tier it was given."""
    app.tasks["tests.unit.conftest.urgent"].apply_async((1,), headers={"aitp_tenant": tenant})
    app.aitp.live.flush()
    store = app.aitp.store
    return store.read_records(store.keys.decisions)[-1]["tier"]


def test_apply_is_audited_and_every_process_follows_at_its_next_round(app, store, tmp_path,
                                                                      monkeypatch):
    make_live(store, "aitp.globex.cpu.hi", "aitp.globex.cpu.mid")
    app.aitp.live.refresh()
    assert tier_of_urgent(app, "globex") == "mid"  # capped by the policy it started with
    monkeypatch.setenv("AITP_ACTOR", "ops-alice")

    out = cli(app, "policy", "apply", policy_file(tmp_path, GLOBEX_HI),
              "--reason", "globex bought the hi tier")
    assert out.exit_code == 0, out.output
    entry = read_active(store)
    assert entry is not None and entry["who"] == "ops-alice"
    assert entry["reason"] == "globex bought the hi tier" and entry["action"] == "apply"
    assert policy_history(store)[0]["digest"] == entry["digest"] == policy_digest(
        parse_policy(GLOBEX_HI))

    app.aitp.live.refresh()  # the background round: the digest differs, so it adopts
    assert app.aitp.policy_digest == entry["digest"]
    assert tier_of_urgent(app, "globex") == "hi"
    store_record = store.read_records(store.keys.decisions)[-1]
    assert store_record["policy"] == entry["digest"]  # decisions name the policy that made them
    assert app.aitp.counters.drain().get("policy_adopted") == 1 or \
        store.counts().get("policy_adopted") == 1


def test_rollback_applies_the_previous_version_again(app, store, tmp_path):
    make_live(store, "aitp.globex.cpu.hi", "aitp.globex.cpu.mid")
    app.aitp.live.refresh()
    app.aitp.live.flush()  # the app's own policy: the initial version in the history
    first = app.aitp.policy_digest
    assert cli(app, "policy", "apply", policy_file(tmp_path, GLOBEX_HI)).exit_code == 0
    app.aitp.live.refresh()
    assert tier_of_urgent(app, "globex") == "hi"

    out = cli(app, "policy", "rollback", "--reason", "too many hi tasks")
    assert out.exit_code == 0, out.output
    entry = read_active(store)
    assert entry is not None and entry["digest"] == first and entry["action"] == "rollback"
    app.aitp.live.refresh()
    assert app.aitp.policy_digest == first
    assert tier_of_urgent(app, "globex") == "mid"
    actions = [h.get("action", "start") for h in policy_history(store)]
    assert actions == ["rollback", "apply", "start"]


def test_rollback_with_nothing_earlier_says_so(app, store):
    out = cli(app, "policy", "rollback")
    assert out.exit_code != 0 and "no an earlier version" not in out.output
    assert "earlier version" in out.output


def test_diff_shows_the_change_and_exits_1(app, store, tmp_path):
    path = policy_file(tmp_path, GLOBEX_HI)
    out = cli(app, "policy", "diff", path)
    assert out.exit_code == 1
    assert '-      "max_tier": "mid"' in out.output and '+      "max_tier": "hi"' in out.output
    same = cli(app, "policy", "diff", policy_file(tmp_path, TEST_POLICY, "same.yaml"))
    assert same.exit_code == 0 and "no difference" in same.output


def test_a_change_of_tiers_is_refused_with_the_reason(app, store, tmp_path):
    two_tiers = {**TEST_POLICY, "tiers": [{"name": "hi", "sla_s": 1}, {"name": "lo", "sla_s": 60}],
                 "tenants": {"acme": {"max_tier": "hi"}, "default": {"max_tier": "lo"}}}
    out = cli(app, "policy", "apply", policy_file(tmp_path, two_tiers))
    assert out.exit_code != 0
    assert "tiers" in out.output and "rolling restart" in out.output
    assert read_active(store) is None


#: The policy of a rolling restart to other tiers.
FOUR_TIERS = {**TEST_POLICY,
              "tiers": [{"name": "fast", "sla_s": 1}, {"name": "normal", "sla_s": 10},
                        {"name": "slow", "sla_s": 60}, {"name": "bulk", "sla_s": 600}],
              "tenants": {"acme": {"max_tier": "fast"}, "globex": {"max_tier": "normal"},
                          "default": {"max_tier": "bulk"}}}


@contextmanager
def app_with(store: Any, policy: dict[str, Any]) -> Iterator[Any]:
    """Another process of the same fleet (the same store), started with ``policy``."""
    other = Celery("other", broker="memory://", backend="cache+memory://")
    other.conf.task_default_queue = "default-q"
    mw = celery_aitp.install(other, policy=policy, store=store)
    try:
        yield other
    finally:
        mw.close()


def test_a_process_started_with_other_tiers_keeps_its_own_and_says_so_once(
        app, store, caplog):
    """Once any policy was applied, a process started with a file of other tiers
    adopted it (and its tiers) on its first round: a rolling restart could never
    change the tiers."""
    apply_policy(store, parse_policy(GLOBEX_HI), app.aitp.policy, source="test", reason="r")
    with app_with(store, FOUR_TIERS) as new, \
            caplog.at_level("WARNING", logger="celery_aitp.deployment"):
        own = new.aitp.policy_digest
        new.aitp.adopt_active_policy()  # a worker at start
        new.aitp.live.refresh()  # and every round after
        new.aitp.live.refresh()
        assert new.aitp.policy_digest == own
        assert new.aitp.policy.tier_names == ("fast", "normal", "slow", "bulk")
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 1, said
        assert "tiers" in said[0] and "rolling restart" in said[0]
        assert "policy apply" in said[0]
        kept = policy_history(store)[0]  # recorded: apply and rollback know it runs
        assert kept["digest"] == own and kept["action"] == "keep"
        app.aitp.live.refresh()  # the process with the applied policy's tiers follows
        assert app.aitp.policy_digest == read_active(store)["digest"]


def test_apply_of_new_tiers_works_once_processes_run_them(app, store, tmp_path):
    """After an apply, ``apply`` of the tiers of a rolling restart was refused for good:
    the active policy's tiers were the only ones it accepted."""
    apply_policy(store, parse_policy(GLOBEX_HI), app.aitp.policy, source="test", reason="r")
    path = policy_file(tmp_path, FOUR_TIERS, "four.yaml")
    refused = cli(app, "policy", "apply", path)  # nobody runs these tiers yet
    assert refused.exit_code != 0 and "rolling restart" in refused.output
    with app_with(store, FOUR_TIERS) as new:
        new.aitp.live.refresh()  # a process restarted with the new file
        out = cli(new, "policy", "apply", path, "--reason", "four tiers")
        assert out.exit_code == 0, out.output
        assert read_active(store)["digest"] == new.aitp.policy_digest
        new.aitp.live.refresh()
        assert new.aitp.policy.tier_names == ("fast", "normal", "slow", "bulk")
        app.aitp.live.refresh()  # not restarted yet: keeps hi/mid/lo
        assert app.aitp.policy.tier_names == ("hi", "mid", "lo")


def test_rollback_reaches_the_policy_of_a_rolling_restart(app, store):
    apply_policy(store, parse_policy(GLOBEX_HI), app.aitp.policy, source="test", reason="r")
    with app_with(store, FOUR_TIERS) as new:
        new.aitp.live.refresh()
        out = cli(app, "policy", "rollback")
        assert out.exit_code == 0, out.output
        assert read_active(store)["digest"] == new.aitp.policy_digest


def test_an_invalid_file_is_refused_by_field(app, store, tmp_path):
    bad = {**TEST_POLICY, "tenants": {"acme": {"max_tier": "top"}}}
    out = cli(app, "policy", "apply", policy_file(tmp_path, bad))
    assert out.exit_code != 0 and "tenants.acme" in out.output
    assert read_active(store) is None


def test_a_process_whose_settings_reject_the_policy_keeps_its_own(app, store):
    app.aitp.settings.__dict__["producer_tenant"] = "globex"  # this producer is globex's
    own = app.aitp.policy_digest
    without_globex = {**TEST_POLICY, "tenants": {"acme": {"max_tier": "hi"},
                                                 "default": {"max_tier": "lo"}}}
    apply_policy(store, parse_policy(without_globex), app.aitp.policy, source="test",
                 reason=None)
    app.aitp.live.refresh()
    assert app.aitp.policy_digest == own
    app.aitp.live.refresh()  # refused once, not retried every round
    assert app.aitp.counters.drain().get("policy_refused") == 1 or \
        store.counts().get("policy_refused") == 1


def test_a_stored_document_that_does_not_validate_is_refused_not_raised(app, store):
    store.client.set(store.keys.any("policy", "active"), json.dumps(
        {"digest": "0" * 16, "policy": {"tiers": "nonsense"}}))
    store.client.set(store.keys.any("policy", "active", "digest"), "0" * 16)
    with pytest.raises(PolicyError):
        active_policy(store)
    own = app.aitp.policy_digest
    app.aitp.live.refresh()
    assert app.aitp.policy_digest == own
    assert tier_of_urgent(app, "acme") == "hi"  # publishing goes on


def test_a_restarted_process_adopts_the_applied_policy_and_adds_no_history(app, store):
    apply_policy(store, parse_policy(GLOBEX_HI), app.aitp.policy, source="test", reason="r")
    app.aitp.live.refresh()  # first round of a process started with TEST_POLICY
    app.aitp.live.flush()
    assert app.aitp.policy_digest == policy_digest(parse_policy(GLOBEX_HI))
    assert [h["digest"] for h in policy_history(store)] == [app.aitp.policy_digest]


def test_swapped_stages_survive_a_policy_change(app, store):
    class Marker:
        name = "priority"
        calls = 0

        def __call__(self, request: Any, decision: Any, view: Any) -> None:
            Marker.calls += 1
            decision.tier = "lo"

    app.aitp.use_stage("priority", Marker())
    apply_policy(store, parse_policy(GLOBEX_HI), app.aitp.policy, source="test", reason=None)
    app.aitp.live.refresh()
    assert app.aitp.policy_digest == policy_digest(parse_policy(GLOBEX_HI))
    app.tasks["tests.unit.conftest.plain"].delay(1)
    assert Marker.calls >= 1


def test_a_worker_restarted_after_an_apply_plans_its_queues_from_the_applied_policy(
        app, store, monkeypatch):
    from types import SimpleNamespace

    from celery_aitp.worker.bootstep import AitpWorkerStep

    # the unit store is given directly, not by URL
    monkeypatch.setattr(AitpWorkerStep, "_check_store", lambda self, app: True)

    with_newco = {**TEST_POLICY, "tenants": {**TEST_POLICY["tenants"], "newco": {}}}
    apply_policy(store, parse_policy(with_newco), app.aitp.policy, source="test", reason="r")
    worker = SimpleNamespace(app=app, hostname="w@test", concurrency=2, consumer=None)
    # started with the older policy, which has no newco: refused (and '*' left newco's
    # queues unread) before the worker read the applied policy at start
    step = AitpWorkerStep(worker, aitp_tenant=("newco",))
    assert app.aitp.policy_digest == policy_digest(parse_policy(with_newco))
    assert {"aitp.newco.cpu.hi", "aitp.newco.cpu.lo"} <= set(step.plan.queue_names())


def test_a_worker_stops_advertising_a_queue_it_no_longer_reads(app, store, monkeypatch):
    """``celery control cancel_consumer`` deselects a queue at run time; still advertised,
    producers routed to it and the janitor left its tasks there."""
    from types import SimpleNamespace

    from celery_aitp.worker.bootstep import AitpWorkerStep

    monkeypatch.setattr(AitpWorkerStep, "_check_store", lambda self, app: True)
    worker = SimpleNamespace(app=app, hostname="w@test", concurrency=2, consumer=None)
    step = AitpWorkerStep(worker, aitp_tenant=("acme",))
    step.advertise()
    assert "aitp.acme.cpu.lo" in store.live_queues()
    app.amqp.queues.deselect("aitp.acme.cpu.lo")  # what cancel_consumer does
    step.advertise()
    assert "aitp.acme.cpu.lo" not in store.live_queues()
    assert "aitp.acme.cpu.hi" in store.live_queues()


def test_a_worker_in_warm_shutdown_stops_advertising_at_once(app, store, monkeypatch):
    """A warm shutdown reads nothing more but waits for its running tasks (hours, for
    long ones): advertised meanwhile, its queues took new tasks nobody would read."""
    from types import SimpleNamespace

    from celery import signals

    from celery_aitp.worker.bootstep import AitpWorkerStep

    monkeypatch.setattr(AitpWorkerStep, "_check_store", lambda self, app: True)
    worker = SimpleNamespace(app=app, hostname="w@test", concurrency=2, consumer=None)
    step = AitpWorkerStep(worker, aitp_tenant=("acme",))
    step.start(worker)
    try:
        wait_for(lambda: "aitp.acme.cpu.lo" in store.live_queues(), 10, "advertised")
        signals.worker_shutting_down.send(sender="w@other", sig="SIGTERM", how="Warm",
                                          exitcode=0)  # another worker's: not this one
        assert not step._stop.wait(0.3) and "aitp.acme.cpu.lo" in store.live_queues()
        signals.worker_shutting_down.send(sender="w@test", sig="SIGTERM", how="Warm",
                                          exitcode=0)
        wait_for(lambda: not store.live_queues(), 10, "withdrawn")
    finally:
        step.stop(worker)


def test_a_worker_flag_the_policy_does_not_know_is_a_usage_error(app):
    """``celery worker`` prints it as a usage error (exit 2), not a 30-line traceback;
    a program that starts a worker still gets a PolicyError."""
    from types import SimpleNamespace

    import click

    from celery_aitp.worker.bootstep import AitpWorkerStep

    worker = SimpleNamespace(app=app, hostname="w@test", concurrency=2, consumer=None)
    with pytest.raises(click.UsageError, match="--aitp-tenant: unknown tenant") as found:
        AitpWorkerStep(worker, aitp_tenant=("nobody",))
    assert isinstance(found.value, PolicyError) and found.value.exit_code == 2


def test_a_tenant_the_policy_does_not_list_is_said_once_in_the_log(app, caplog):
    """Counted only, unlisted tenants silently became the default tenant."""
    with caplog.at_level("WARNING", logger="celery_aitp.publish.tenant_stage"):
        for name in ("cust01", "cust02", "cust01"):
            app.tasks["tests.unit.conftest.plain"].apply_async(
                (1,), headers={"aitp_tenant": name})
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "'cust01'" in said[0] and "unlisted_tenants" in said[0]
    assert app.aitp.counters.totals["tenant_unknown"] == 3


def test_a_tenant_name_that_is_not_valid_is_said_to_be_so(app, caplog):
    """Mixed-case customer ids are common: advice to set unlisted_tenants was wrong."""
    with caplog.at_level("WARNING", logger="celery_aitp.publish.tenant_stage"):
        app.tasks["tests.unit.conftest.plain"].apply_async(
            (1,), headers={"aitp_tenant": "AcmeCorp"})
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "not a valid tenant name" in said[0]
    assert "unlisted_tenants" not in said[0]
