"""A caller's message priority through the middleware (publish/caller_priority.py).

Redis (the memory transport has its layout): a routed task keeps the priority Celery
gives it, from the call, the task or ``task_default_priority``, and a retry keeps it.
RabbitMQ: a task with a priority of its own keeps Celery's route with that priority.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.app.amqp import task_message

from celery_aitp.layout import AMQP_MAX_PRIORITY
from tests.unit.conftest import make_live

ACME = {"aitp_tenant": "acme"}


def refresh(app: Any) -> None:
    app.aitp.live.current()
    app.aitp.live.refresh()


def routed(app: Celery, store: Any) -> Celery:
    make_live(store, "aitp.acme.cpu.hi", "aitp.acme.cpu.lo")
    refresh(app)
    return app


def test_a_routed_task_keeps_the_callers_priority_on_redis(app, store, sent):
    routed(app, store).tasks["tests.unit.conftest.urgent"].apply_async(
        (1,), headers=ACME, priority=7)
    (msg,) = sent
    assert msg["routing_key"] == "aitp.acme.cpu.hi" and msg["aitp"]["routed"] is True
    assert msg["priority"] == 7


def test_a_routed_task_without_a_priority_gets_none_as_in_celery(app, store, sent):
    routed(app, store).tasks["tests.unit.conftest.urgent"].apply_async((1,), headers=ACME)
    assert sent[-1]["routing_key"] == "aitp.acme.cpu.hi" and sent[-1]["priority"] is None


def test_task_and_config_priorities_reach_the_tier_queue(app, store, sent):
    @app.task(shared=False, priority=4, aitp={"tier": "hi"})
    def by_task() -> None: ...

    routed(app, store)
    by_task.apply_async(headers=ACME)
    app.conf.task_default_priority = 6

    @app.task(shared=False)
    def by_config() -> None: ...

    by_config.apply_async(headers=ACME)
    assert [(m["routing_key"], m["priority"]) for m in sent] == [
        ("aitp.acme.cpu.hi", 4), ("aitp.acme.cpu.lo", 6)]


def _message(task_id: str = "t1") -> Any:
    return task_message(headers={"id": task_id, "task": "tests.unit.conftest.plain"},
                        properties={}, body=((1,), {}, {}), sent_event=None)


def test_a_retry_into_its_tier_queue_keeps_its_priority_on_redis(app, store):
    routed(app, store)
    options = app.aitp.on_publish("tests.unit.conftest.plain", _message(),
                                  {"queue": "aitp.acme.cpu.lo", "priority": 7})
    assert options["queue"].name == "aitp.acme.cpu.lo" and options["priority"] == 7


def test_on_rabbitmq_a_priority_of_its_own_keeps_celerys_route(rabbit_app, store, sent):
    task = routed(rabbit_app, store).tasks["tests.unit.conftest.urgent"]
    task.apply_async((1,), headers=ACME, priority=3)
    task.apply_async((1,), headers=ACME)
    own, tiered = sent
    assert own["routing_key"] == "default-q" and own["priority"] == 3
    assert own["aitp"]["routed"] is False and own["aitp"]["reason"] == "explicit_queue"
    assert tiered["routing_key"] == "aitp.acme.cpu" and tiered["priority"] == AMQP_MAX_PRIORITY
    assert rabbit_app.aitp.counters.totals["explicit_priority"] == 1


def test_on_rabbitmq_task_default_priority_keeps_celerys_route(rabbit_app, store, sent):
    routed(rabbit_app, store)
    rabbit_app.conf.task_default_priority = 5

    @rabbit_app.task(shared=False)
    def by_config() -> None: ...

    by_config.apply_async(headers=ACME)
    assert (sent[-1]["routing_key"], sent[-1]["priority"]) == ("default-q", 5)
