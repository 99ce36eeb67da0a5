"""The publish path and the janitor with RabbitMQ's layout (decided on memory://).

The decision does not depend on the transport, only the layout does; so these tests run
the memory transport with the middleware told its broker is RabbitMQ.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery.app.amqp import task_message

import celery_aitp
from celery_aitp.core.request import read_header
from celery_aitp.errors import PolicyError
from celery_aitp.layout import AMQP_MAX_PRIORITY
from celery_aitp.stubs import MemoryQueueOps
from celery_aitp.worker.bootstep import AitpWorkerStep
from celery_aitp.worker.janitor import Janitor
from tests.conftest import TEST_POLICY
from tests.unit.conftest import make_live


def refresh(app: Any) -> None:
    app.aitp.live.current()
    app.aitp.live.refresh()


def test_routed_task_goes_to_the_tenant_priority_queue_with_its_tier_as_priority(
        rabbit_app, store, sent):
    make_live(store, "aitp.acme.cpu.hi", "aitp.acme.cpu.lo")
    refresh(rabbit_app)
    rabbit_app.tasks["tests.unit.conftest.urgent"].apply_async(
        (1,), headers={"aitp_tenant": "acme"})
    rabbit_app.tasks["tests.unit.conftest.plain"].apply_async(
        (1,), headers={"aitp_tenant": "acme"})
    hi, lo = sent[-2:]
    assert hi["routing_key"] == lo["routing_key"] == "aitp.acme.cpu"
    assert hi["aitp"]["queue"] == "aitp.acme.cpu.hi" and lo["aitp"]["queue"] == "aitp.acme.cpu.lo"
    assert hi["priority"] == AMQP_MAX_PRIORITY and lo["priority"] == AMQP_MAX_PRIORITY - 2
    (declared,) = hi["declare"]
    assert declared.queue_arguments == {"x-max-priority": AMQP_MAX_PRIORITY}


def _message(task_id: str = "t1") -> Any:
    return task_message(headers={"id": task_id, "task": "tests.unit.conftest.plain"},
                        properties={}, body=((1,), {}, {}), sent_event=None)


def test_a_retry_to_its_live_broker_queue_keeps_queue_and_priority(rabbit_app, store):
    make_live(store, "aitp.acme.cpu.lo")
    refresh(rabbit_app)
    options = rabbit_app.aitp.on_publish("tests.unit.conftest.plain", _message(),
                                         {"queue": "aitp.acme.cpu", "priority": 8})
    assert options["queue"].name == "aitp.acme.cpu"
    assert options["queue"].queue_arguments == {"x-max-priority": AMQP_MAX_PRIORITY}
    assert options["priority"] == 8
    assert read_header(options["headers"]["aitp"])["reason"] == "explicit_queue"


def test_an_explicit_logical_name_is_sent_to_its_broker_queue(rabbit_app, store):
    make_live(store, "aitp.acme.cpu.mid")
    refresh(rabbit_app)
    options = rabbit_app.aitp.on_publish("tests.unit.conftest.plain", _message(),
                                         {"queue": "aitp.acme.cpu.mid"})
    assert options["queue"].name == "aitp.acme.cpu"
    assert options["priority"] == AMQP_MAX_PRIORITY - 1


def test_an_explicit_broker_queue_nobody_serves_falls_back_to_default(rabbit_app, store):
    make_live(store)
    refresh(rabbit_app)
    options = rabbit_app.aitp.on_publish("tests.unit.conftest.plain", _message(),
                                         {"queue": "aitp.acme.cpu", "priority": 8})
    assert options["queue"] == "default-q"
    assert read_header(options["headers"]["aitp"])["reason"] == "explicit_queue_dead"


def test_janitor_drains_a_broker_queue_only_when_none_of_its_tiers_is_served(rabbit_app, store):
    ops = MemoryQueueOps()
    for queue in ("aitp.acme.cpu", "aitp.globex.cpu"):
        ops.queues[queue].extend([(0.0, "m1"), (0.0, "m2")])
    make_live(store, "aitp.acme.cpu.lo")  # one tier of acme/cpu is still served
    moved = Janitor(rabbit_app.aitp, ops).sweep()
    assert moved == {"aitp.globex.cpu": 2}
    assert len(ops.queues["default-q"]) == 2 and len(ops.queues["aitp.acme.cpu"]) == 2


def test_evacuate_accepts_logical_names(rabbit_app):
    ops = MemoryQueueOps()
    ops.queues["aitp.acme.gpu"].append((0.0, "m"))
    assert Janitor(rabbit_app.aitp, ops).evacuate(["aitp.acme.gpu.hi"]) == {"aitp.acme.gpu": 1}


def test_rabbitmq_without_a_store_url_falls_back_and_is_reported_once(caplog):
    app = Celery("nostore", broker="amqp://guest:guest@127.0.0.1:1//")
    app.conf.task_default_queue = "default-q"
    mw = celery_aitp.install(app, policy=TEST_POLICY)
    with caplog.at_level("ERROR", logger="celery_aitp.middleware"):
        first = mw.on_publish("x", _message("a"), {"headers": {"aitp_tenant": "acme"}})
        mw.on_publish("x", _message("b"), {})
    assert read_header(first["headers"]["aitp"])["reason"] == "config_error"
    assert read_header(first["headers"]["aitp"])["routed"] is False and "queue" not in first
    assert first["headers"]["aitp_tenant"] == "acme"  # the caller's headers are kept
    assert [r.getMessage() for r in caplog.records].count(
        next(r.getMessage() for r in caplog.records)) == 1
    assert "aitp_store_url" in caplog.records[0].getMessage()
    assert mw.counters.totals["decisions:unknown::::config_error"] == 2


def test_a_missing_policy_file_still_gives_every_message_its_header_logged_once(
        caplog, tmp_path):
    """The annotator's layout and queues come from the policy: with the file missing it
    could not be built, and every publish went out without a header, with an ERROR."""
    app = Celery("nopolicy", broker="memory://")
    app.conf.aitp_policy = str(tmp_path / "missing.yaml")
    mw = celery_aitp.install(app, store_url="redis://127.0.0.1:1/0")
    with caplog.at_level("WARNING", logger="celery_aitp"):
        sent = [mw.on_publish("x", _message(i), {"headers": {"mine": 1}, "queue": "q"})
                for i in "abc"]
    for options in sent:
        assert read_header(options["headers"]["aitp"])["reason"] == "config_error"
        assert options["headers"]["mine"] == 1 and options["queue"] == "q"  # Celery's route
    assert len(caplog.records) == 1 and "missing.yaml" in caplog.records[0].getMessage()
    assert mw.counters.totals["decisions:unknown::::config_error"] == 3


def test_a_tier_worker_refuses_to_start_on_rabbitmq_without_a_store_url():
    app = Celery("nostore", broker="amqp://guest:guest@127.0.0.1:1//")
    celery_aitp.install(app, policy=TEST_POLICY)
    worker = SimpleNamespace(app=app, hostname="w@test")
    with pytest.raises(PolicyError, match="aitp_store_url"):
        AitpWorkerStep(worker, aitp_tenant=("acme",))


def test_a_standard_worker_keeps_running_without_a_store_url(caplog):
    app = Celery("nostore", broker="amqp://guest:guest@127.0.0.1:1//")
    celery_aitp.install(app, policy=TEST_POLICY)
    worker = SimpleNamespace(app=app, hostname="w@test")
    with caplog.at_level("ERROR", logger="celery_aitp.worker.bootstep"):
        step = AitpWorkerStep(worker)
        step.start(worker)  # no janitor, no live view: nothing to connect to
    assert step.runs_aitp is False and step._threads == []
    assert "aitp_store_url" in caplog.text and "without the janitor" in caplog.text
    step.stop(worker)


def test_a_standard_worker_runs_with_a_broken_policy_and_a_flagged_one_refuses(
        caplog, tmp_path):
    """Producers with the same broken policy send every task on Celery's route: the
    workers without AITP flags must keep serving it, not refuse to start."""
    app = Celery("nopolicy", broker="memory://")
    app.conf.aitp_policy = str(tmp_path / "missing.yaml")
    celery_aitp.install(app, store_url="redis://127.0.0.1:1/0")
    worker = SimpleNamespace(app=app, hostname="w@test")
    with caplog.at_level("ERROR", logger="celery_aitp.worker.bootstep"):
        step = AitpWorkerStep(worker)
        step.start(worker)
    assert step.runs_aitp is False and step._threads == [] and not step.plan.enabled
    assert "missing.yaml" in caplog.text and "without AITP" in caplog.text
    step.stop(worker)
    with pytest.raises(PolicyError, match="missing.yaml"):
        AitpWorkerStep(worker, aitp_tenant=("acme",))


def test_dashboard_shows_one_row_per_rabbitmq_queue_with_its_depth(store):
    from celery_aitp.dashboard.fleet import Fleet
    from celery_aitp.layout import PerTenantLayout
    from celery_aitp.policy import parse_policy

    policy = parse_policy(TEST_POLICY)
    ops = MemoryQueueOps()
    ops.queues["aitp.acme.cpu"].extend([(0.0, "m")] * 3)
    make_live(store, "aitp.acme.cpu.hi")
    fleet = Fleet(store, policy, "default-q", lambda: ops, worker_ttl_s=60.0, refresh_s=0.0,
                  layout=PerTenantLayout(policy.tier_names))
    rows = {row["queue"]: row for row in fleet.snapshot().queues}
    assert "aitp.acme.cpu.hi" not in rows and "default-q" in rows
    acme = rows["aitp.acme.cpu"]
    assert acme["depth"] == 3 and acme["tier"] is None and acme["tenant"] == "acme"
    assert acme["live"] is True and acme["orphaned"] is False
    assert rows["aitp.globex.gpu"]["live"] is False


def test_a_tier_worker_refuses_quorum_queues_with_the_reason():
    app = Celery("quorum", broker="amqp://guest:guest@127.0.0.1:1//")
    app.conf.task_default_queue_type = "quorum"
    celery_aitp.install(app, policy=TEST_POLICY, store_url="redis://127.0.0.1:1/0")
    worker = SimpleNamespace(app=app, hostname="w@test")
    with pytest.raises(PolicyError, match="quorum queue.*classic priority queues"):
        AitpWorkerStep(worker, aitp_tenant=("acme",))
    AitpWorkerStep(worker)  # a standard worker of the same app keeps running


def test_a_tier_worker_takes_classic_queues_on_rabbitmq():
    from celery_aitp.worker.bootstep import refuse_quorum_queues

    app = Celery("classic", broker="amqp://guest:guest@127.0.0.1:1//")
    refuse_quorum_queues(app, "amqp")  # nothing raised
    app.conf.task_default_queue_type = "quorum"
    refuse_quorum_queues(app, "redis")  # only RabbitMQ has quorum queues
