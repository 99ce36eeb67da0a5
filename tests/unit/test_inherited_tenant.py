"""Tasks published from inside a running task (chain steps, chord bodies, sub-tasks)
keep the running task's tenant unless they name their own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from celery import signals

from celery_aitp.core.request import read_header
from tests.unit.conftest import make_live


@pytest.fixture
def running(app: Any) -> Iterator[Any]:
    """Pretend this thread runs a task whose ``aitp`` header is ``header``: Celery's
    ``task_prerun`` signal, as the worker sends it (``task_postrun`` at the end)."""
    task = app.tasks["tests.unit.conftest.plain"]
    pushed: list[Any] = []

    def run_as(header: Any) -> None:
        task.push_request(aitp=header, called_directly=False)
        signals.task_prerun.send(sender=task, task_id="parent", task=task, args=(), kwargs={})
        pushed.append(task)

    yield run_as
    for task in pushed:
        signals.task_postrun.send(sender=task, task_id="parent", task=task, args=(), kwargs={},
                                  retval=None, state="SUCCESS")
        task.pop_request()


def publish(app: Any, **options: Any) -> dict[str, Any]:
    app.aitp.live.current()
    app.aitp.live.refresh()
    result: dict[str, Any] = {}

    from celery.signals import before_task_publish

    def capture(headers: Any = None, routing_key: Any = None, **_: Any) -> None:
        result.update(read_header(headers["aitp"]), routing_key=routing_key)

    before_task_publish.connect(capture, weak=False)
    try:
        app.tasks["tests.unit.conftest.urgent"].apply_async((1,), **options)
    finally:
        before_task_publish.disconnect(capture)
    return result


def test_a_sub_task_inherits_the_running_tasks_tenant(app, store, running):
    make_live(store, "aitp.acme.cpu.hi")
    running({"tenant": "acme", "tier": "hi"})
    decided = publish(app)
    assert decided["tenant"] == "acme" and decided["routing_key"] == "aitp.acme.cpu.hi"


def test_its_own_header_wins_over_the_inherited_tenant(app, store, running):
    make_live(store)
    running({"tenant": "acme"})
    assert publish(app, headers={"aitp_tenant": "globex"})["tenant"] == "globex"


def test_inheritance_never_raises_the_tier_cap(app, store, running):
    make_live(store, "aitp.globex.cpu.mid")
    running({"tenant": "globex", "tier": "hi"})  # urgent declares hi; globex may use mid
    assert publish(app)["tier"] == "mid"


@pytest.mark.parametrize("header", [None, "acme", {"tenant": 5}, {"tenant": "nobody"}])
def test_a_missing_or_bad_running_header_gives_the_default_tenant(app, store, running, header):
    make_live(store)
    running(header)
    assert publish(app)["tenant"] == "default"


def test_the_running_task_gets_its_header_as_a_mapping(app, store, running):
    make_live(store, "aitp.globex.cpu.mid")
    text = json.dumps({"v": 2, "tenant": "globex", "tier": "mid", "decided_at": 5.0})
    running(text)
    assert app.tasks["tests.unit.conftest.plain"].request.aitp == json.loads(text)
    assert publish(app)["tenant"] == "globex"  # and its sub-tasks inherit the tenant


def test_outside_a_worker_task_nothing_is_inherited(app, store):
    make_live(store)
    assert publish(app)["tenant"] == "default"


def test_after_the_task_ends_nothing_is_inherited(app, store, running):
    make_live(store, "aitp.acme.cpu.hi")
    running({"tenant": "acme"})
    task = app.tasks["tests.unit.conftest.plain"]
    signals.task_postrun.send(sender=task, task_id="parent", task=task, args=(), kwargs={},
                              retval=None, state="SUCCESS")
    assert publish(app)["tenant"] == "default"
