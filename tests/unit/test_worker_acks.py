"""Late acks for tier-queue deliveries only; a task's own acks_late=False is kept and named.

The Request classes are the ones Celery's strategy builds (``create_request_cls`` over
the task's ``Request``), fed a task message from a tier queue or from the default queue;
acknowledgements are counted through the request's ``on_ack``.
"""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.mocks import TaskMessage
from celery.worker.request import create_request_cls
from kombu.utils.imports import symbol_by_name

import celery_aitp
from celery_aitp.worker import acks
from celery_aitp.worker.bootstep import AitpWorkerStep
from tests.conftest import TEST_POLICY

TIER = "aitp.acme.cpu.lo"


def make_app(**conf: Any) -> Celery:
    app = Celery("acks", broker="memory://", backend="cache+memory://")
    app.conf.update(task_default_queue="default-q",
                    task_annotations={"acks.annotated": {"acks_late": False}}, **conf)
    # A store URL only for the bootstep's check: these tests start no thread.
    celery_aitp.install(app, policy=TEST_POLICY, store_url="redis://127.0.0.1:1/0")

    class KeepsEarly(app.Task):  # a base class of the user's that sets it
        acks_late = False

    class ClassTask(app.Task):
        name = "acks.class_early"
        acks_late = False

        def run(self) -> None:
            return None

    class ClassPlain(app.Task):
        name = "acks.class_plain"

        def run(self) -> None:
            return None

    @app.task(shared=False, name="acks.plain")
    def plain() -> None:
        return None

    @app.task(shared=False, name="acks.early", acks_late=False)
    def early() -> None:
        return None

    @app.task(shared=False, name="acks.late", acks_late=True)
    def late() -> None:
        return None

    @app.task(shared=False, name="acks.base_early", base=KeepsEarly)
    def base_early() -> None:
        return None

    @app.task(shared=False, name="acks.annotated")
    def annotated() -> None:
        return None

    app.register_task(ClassTask())
    app.register_task(ClassPlain())
    return app


class Delivery:
    """One request built as a worker's strategy builds it; acks and rejects counted."""

    def __init__(self, app: Celery, name: str, routing_key: str) -> None:
        task = app.tasks[name]
        self.acks: list[str] = []
        self.rejects: list[bool] = []
        message = TaskMessage(name, args=(), kwargs={})
        message.delivery_info = {"exchange": routing_key, "routing_key": routing_key}
        message.properties = {}
        pool = SimpleNamespace(apply_async=lambda *a, **k: None)
        request_cls = create_request_cls(symbol_by_name(task.Request), task, pool, "w@test",
                                         None, app=app)
        self.request = request_cls(
            message, app=app, hostname="w@test",
            on_ack=lambda *a: self.acks.append("ack"),
            on_reject=lambda logger, errors, requeue: self.rejects.append(requeue))

    def start(self) -> Delivery:
        self.request.on_accepted(pid=123, time_accepted=time.monotonic())
        return self

    def succeed(self) -> Delivery:
        self.request.on_success((False, None, 0.1))
        return self


@pytest.fixture
def app() -> Celery:
    app = make_app()
    app.finalize()
    return app


def test_only_tasks_that_leave_acks_to_the_configuration_ack_late_on_tiers(app):
    plan = acks.plan_acks(app.tasks.values())
    assert {"acks.plain", "acks.class_plain"} <= set(plan.tier_late)
    assert plan.kept_early == ["acks.annotated", "acks.base_early", "acks.class_early",
                               "acks.early"]
    assert "acks.late" not in plan.tier_late + plan.kept_early + plan.unknown
    assert plan.unknown == []


def test_a_tier_delivery_is_acknowledged_after_the_run_not_at_its_start(app):
    acks.ack_tier_deliveries_late(app, [TIER])
    delivery = Delivery(app, "acks.plain", TIER).start()
    assert delivery.acks == []  # running, still unacknowledged: no reserve behind it
    delivery.succeed()
    assert delivery.acks == ["ack"]


class WakeCounter:
    """Stands in for the worker's event loop: counts wake-ups (call_soon)."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def call_soon(self, callback: Any, *args: Any) -> None:
        self.calls.append(callback)


def test_a_late_ack_wakes_the_consumer_and_an_early_one_does_not(app):
    # the freed prefetch slot is refilled on the loop's next turn, not when its poll
    # times out; an early ack (default queue) frees no slot a run was holding
    from kombu.asynchronous import get_event_loop, set_event_loop

    acks.ack_tier_deliveries_late(app, [TIER])
    loop, before = WakeCounter(), get_event_loop()
    set_event_loop(loop)  # type: ignore[arg-type]
    try:
        delivery = Delivery(app, "acks.plain", TIER).start()
        assert loop.calls == []
        delivery.succeed()
        assert delivery.acks == ["ack"] and len(loop.calls) == 1
        Delivery(app, "acks.plain", "default-q").start().succeed()
        assert len(loop.calls) == 1
    finally:
        set_event_loop(before)
    Delivery(app, "acks.plain", TIER).start().succeed()  # no loop (not a worker): no error


def test_a_default_queue_delivery_keeps_the_tasks_early_ack(app):
    acks.ack_tier_deliveries_late(app, [TIER])
    delivery = Delivery(app, "acks.plain", "default-q").start()
    assert delivery.acks == ["ack"]
    delivery.succeed()
    assert delivery.acks == ["ack"]  # once


def test_a_tier_delivery_that_fails_is_settled_once_by_celerys_acks_late_rules(app):
    acks.ack_tier_deliveries_late(app, [TIER])
    delivery = Delivery(app, "acks.plain", TIER).start()
    try:
        raise ValueError("boom")
    except ValueError:
        from billiard.einfo import ExceptionInfo

        delivery.request.on_failure(ExceptionInfo())
    assert delivery.acks == ["ack"] and delivery.rejects == []  # acks_on_failure: True


@pytest.mark.parametrize("name", ["acks.early", "acks.base_early", "acks.annotated",
                                  "acks.class_early"])
def test_a_task_that_sets_acks_late_false_acks_early_even_on_a_tier_queue(app, name):
    acks.ack_tier_deliveries_late(app, [TIER])
    delivery = Delivery(app, name, TIER).start()
    assert delivery.acks == ["ack"]
    assert app.tasks[name].acks_late is False


def test_the_task_itself_is_not_changed(app):
    task = app.tasks["acks.plain"]
    acks.ack_tier_deliveries_late(app, [TIER])
    assert task.acks_late is False and app.conf.task_acks_late is False
    assert app.tasks["acks.plain"] is task


def test_task_acks_late_in_the_configuration_still_acks_late_everywhere():
    app = make_app(task_acks_late=True)
    app.finalize()
    plan = acks.ack_tier_deliveries_late(app, [TIER])
    assert "acks.plain" not in plan.tier_late
    delivery = Delivery(app, "acks.plain", "default-q").start()
    assert delivery.acks == []
    assert Delivery(app, "acks.early", TIER).start().acks == ["ack"]


def test_a_task_created_before_install_is_kept_and_named():
    app = Celery("acks-before", broker="memory://")

    class Before(app.Task):
        name = "acks.before"

        def run(self) -> None:
            return None

    task = app.register_task(Before())
    acks._declared.pop(Before, None)  # as if it had been created before tracking began
    plan = acks.plan_acks([task])
    assert plan.unknown == ["acks.before"] and plan.tier_late == []
    assert "acks.before" in " ".join(plan.warnings())


def test_a_strict_worker_names_the_conflicts_at_start_up(app, caplog):
    worker = SimpleNamespace(app=app, hostname="w@test", prefetch_multiplier=4)
    with caplog.at_level(logging.INFO, logger="celery_aitp.worker.bootstep"):
        AitpWorkerStep(worker, aitp_tenant=("acme",), aitp_no_default_queue=False)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "acks.early" in warnings[0] and "acks.plain" not in warnings[0]
    assert "prefetch multiplier 4 -> 1" in caplog.text
    assert worker.prefetch_multiplier == 1
    assert Delivery(app, "acks.plain", TIER).start().acks == []
    assert Delivery(app, "acks.plain", "default-q").start().acks == ["ack"]


def test_no_default_queue_keeps_the_other_queues_given_with_q(app):
    """``-Q special --aitp-no-default-queue`` dropped ``special`` too: its tasks, sent
    there by ``queue=`` or ``task_routes``, were stranded."""
    app.amqp.queues.select(["special", app.conf.task_default_queue])  # what -Q does
    worker = SimpleNamespace(app=app, hostname="w@test", prefetch_multiplier=1)
    AitpWorkerStep(worker, aitp_tenant=("acme",), aitp_no_default_queue=True)
    consumed = list(app.amqp.queues.consume_from)
    assert "special" in consumed and app.conf.task_default_queue not in consumed
    assert consumed[0] == "aitp.acme.cpu.hi"  # the tiers first


def test_a_worker_without_strict_changes_no_acks(app, caplog):
    worker = SimpleNamespace(app=app, hostname="w@test", prefetch_multiplier=1)
    with caplog.at_level(logging.WARNING, logger="celery_aitp.worker.bootstep"):
        AitpWorkerStep(worker, aitp_tenant=("acme",), aitp_strict=False)
    assert caplog.records == []
    assert Delivery(app, "acks.plain", TIER).start().acks == ["ack"]
