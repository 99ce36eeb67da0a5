"""The publish hook on an in-memory broker: routing, explicit queues, headers, fallback."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from celery_aitp.core import running
from celery_aitp.core.request import read_header
from celery_aitp.publish.hook import AitpAMQP, AitpRouter
from tests.unit.conftest import make_live


def refresh(app: Any) -> None:
    app.aitp.live.current()
    app.aitp.live.refresh()


def header(msg: dict[str, Any]) -> dict[str, Any]:
    return read_header(msg["headers"]["aitp"])


def test_install_swaps_in_the_aitp_amqp_and_router(app):
    assert isinstance(app.amqp, AitpAMQP)
    assert isinstance(app.amqp.router, AitpRouter)


def test_routes_to_a_live_tier_queue(app, store, published):
    make_live(store, "aitp.acme.cpu.hi")
    refresh(app)
    app.tasks["tests.unit.conftest.urgent"].apply_async((1,), headers={"aitp_tenant": "acme"})
    msg = published[-1]
    assert msg["routing_key"] == "aitp.acme.cpu.hi"
    h = header(msg)
    assert h["routed"] is True and h["tenant"] == "acme" and h["tier"] == "hi"
    assert h["reason"] == "routed" and h["stage"] == "takeover"
    assert {"tenant", "tier", "accelerator", "predicted_runtime_s", "stage", "routed", "reason",
            "decided_at"} <= set(h)


def test_the_header_travels_as_one_compact_strict_json_object(app, store, published):
    make_live(store, "aitp.acme.cpu.hi")
    refresh(app)
    app.tasks["tests.unit.conftest.urgent"].apply_async((1,), headers={"aitp_tenant": "acme"})
    raw = published[-1]["headers"]["aitp"]
    assert type(raw) is str and ", " not in raw and ": " not in raw
    assert json.loads(raw) == read_header(raw) and json.loads(raw)["v"] == 2
    assert read_header({"v": 1, "tenant": "acme"}) == {"v": 1, "tenant": "acme"}  # in flight
    assert read_header(raw.encode()) == json.loads(raw)


def test_falls_back_when_no_live_worker(app, store, published):
    make_live(store)
    refresh(app)
    app.tasks["tests.unit.conftest.urgent"].apply_async((1,), headers={"aitp_tenant": "acme"})
    assert published[-1]["routing_key"] == "default-q"
    assert header(published[-1])["reason"] == "no_live_worker"
    assert app.aitp.counters.totals["decisions:takeover:acme:hi:cpu:no_live_worker"] == 1


def test_explicit_queue_is_respected_and_annotated(app, store, published):
    make_live(store, "aitp.acme.cpu.hi")
    refresh(app)
    task = app.tasks["tests.unit.conftest.urgent"]
    task.apply_async((1,), queue="mine", headers={"aitp_tenant": "acme"})
    assert published[-1]["routing_key"] == "mine"
    assert header(published[-1])["reason"] == "explicit_queue"
    assert header(published[-1])["routed"] is False


def test_user_task_routes_are_respected(app, store, published):
    app.conf.task_routes = {"tests.unit.conftest.plain": {"queue": "hand-routed"}}
    make_live(store, "aitp.default.cpu.lo")
    refresh(app)
    app.tasks["tests.unit.conftest.plain"].delay(1)
    assert published[-1]["routing_key"] == "hand-routed"
    assert header(published[-1])["reason"] == "explicit_queue"


def test_a_route_without_a_destination_leaves_the_task_to_the_middleware(app, store,
                                                                         published):
    """``task_routes`` giving a priority only chose no queue: it was taken as an
    explicit one and never routed."""
    app.conf.task_routes = {"tests.unit.conftest.plain": {"priority": 3}}
    make_live(store, "aitp.default.cpu.lo")
    refresh(app)
    app.tasks["tests.unit.conftest.plain"].delay(1)
    assert published[-1]["routing_key"] == "aitp.default.cpu.lo"
    assert header(published[-1])["routed"] is True


def test_explicit_dead_tier_queue_falls_back_to_default(app, store, published):
    make_live(store)
    refresh(app)
    app.tasks["tests.unit.conftest.plain"].apply_async((1,), queue="aitp.acme.cpu.hi")
    assert published[-1]["routing_key"] == "default-q"
    assert header(published[-1])["reason"] == "explicit_queue_dead"


def test_caller_headers_are_kept_and_a_forged_aitp_header_is_replaced(app, store, published):
    make_live(store, "aitp.default.cpu.lo")
    refresh(app)
    forged = {"tier": "hi", "routed": True, "tenant": "acme"}
    app.tasks["tests.unit.conftest.plain"].apply_async(
        (1,), headers={"custom": "kept", "aitp": forged})
    msg = published[-1]
    assert msg["headers"]["custom"] == "kept"
    assert header(msg)["tenant"] == "default" and header(msg)["tier"] == "lo"
    assert msg["headers"]["id"]  # Celery's own protocol headers survive
    assert msg["headers"]["task"] == "tests.unit.conftest.plain"


def test_header_cannot_raise_a_tier_above_the_tenant_cap(app, store, published):
    make_live(store, "aitp.globex.cpu.mid", "aitp.globex.cpu.hi")
    refresh(app)
    app.tasks["tests.unit.conftest.urgent"].apply_async((1,), headers={"aitp_tenant": "globex"})
    assert header(published[-1])["tier"] == "mid"
    assert published[-1]["routing_key"] == "aitp.globex.cpu.mid"


def test_bad_tenant_headers_fall_back_to_default_tenant_and_are_counted(app, store, published):
    make_live(store)
    refresh(app)
    task = app.tasks["tests.unit.conftest.plain"]
    for bad in (["acme"], 12, "x" * 10_000, "unknown-tenant", {"a": 1}, None):
        task.apply_async((1,), headers={"aitp_tenant": bad})
        assert header(published[-1])["tenant"] == "default"
    totals = app.aitp.counters.totals
    assert totals["tenant_invalid"] == 4 and totals["tenant_unknown"] == 1


def test_send_task_by_name_is_decided(app, store, published):
    make_live(store, "aitp.acme.cpu.lo")
    refresh(app)
    app.send_task("remote.task", (1,), headers={"aitp_tenant": "acme"})
    assert published[-1]["routing_key"] == "aitp.acme.cpu.lo"


def test_a_failing_stage_falls_back_and_never_raises(app, store, published):
    make_live(store, "aitp.acme.cpu.hi")
    refresh(app)

    class Broken:
        name = "priority"

        def __call__(self, *args: Any) -> None:
            raise ZeroDivisionError("boom")

    app.aitp.use_stage("priority", Broken())
    app.tasks["tests.unit.conftest.urgent"].apply_async((1,), headers={"aitp_tenant": "acme"})
    assert published[-1]["routing_key"] == "default-q"
    assert header(published[-1])["reason"] == "error:ZeroDivisionError"


def test_unreachable_store_falls_back(app, published):
    from celery_aitp.store import Keys, RedisStore, connect

    app.aitp.store = RedisStore(connect("redis://127.0.0.1:1/0", timeout_s=0.1), Keys("dead"))
    app.tasks["tests.unit.conftest.urgent"].apply_async((1,), headers={"aitp_tenant": "acme"})
    assert published[-1]["routing_key"] == "default-q"
    assert header(published[-1])["reason"] == "store_unreachable"


def test_shadow_stage_annotates_but_does_not_route(app, store, published):
    make_live(store, "aitp.acme.cpu.hi", stage="coexistence")
    refresh(app)
    app.tasks["tests.unit.conftest.urgent"].apply_async((1,), headers={"aitp_tenant": "acme"})
    h = header(published[-1])
    assert published[-1]["routing_key"] == "default-q"
    assert h["reason"] == "shadow" and h["queue"] == "aitp.acme.cpu.hi" and h["routed"] is False


def test_decisions_are_recorded_in_the_store(app, store, published):
    make_live(store, "aitp.acme.cpu.hi")
    refresh(app)
    result = app.tasks["tests.unit.conftest.urgent"].apply_async(
        (1,), headers={"aitp_tenant": "acme"})
    app.aitp.live.flush()
    records = store.read_records(store.keys.decisions)
    assert records[-1]["task_id"] == result.id
    assert records[-1]["queue"] == "aitp.acme.cpu.hi"


def test_a_retry_into_a_tier_queue_goes_to_the_default_queue_after_a_rollback(app, store,
                                                                              published):
    make_live(store, "aitp.acme.cpu.hi", stage="coexistence")
    refresh(app)
    task = app.tasks["tests.unit.conftest.urgent"]
    task.apply_async((1,), queue="aitp.acme.cpu.hi", headers={"aitp_tenant": "acme"})
    assert published[-1]["routing_key"] == "default-q"
    assert header(published[-1])["reason"] == "explicit_queue_standard"


def test_a_retry_into_a_live_tier_queue_stays_there_in_takeover(app, store, published):
    make_live(store, "aitp.acme.cpu.hi")
    refresh(app)
    task = app.tasks["tests.unit.conftest.urgent"]
    task.apply_async((1,), queue="aitp.acme.cpu.hi", headers={"aitp_tenant": "acme"})
    assert published[-1]["routing_key"] == "aitp.acme.cpu.hi"
    assert header(published[-1])["reason"] == "explicit_queue"


def test_chain_steps_carry_the_root_id_the_arm_is_decided_on(app, store, published):
    from celery import chain

    make_live(store, "aitp.acme.cpu.hi", stage="split")
    store.write_stage({"stage": "split", "split": {"percent": 50}}, who="test")
    refresh(app)
    task = app.tasks["tests.unit.conftest.urgent"]
    result = chain(task.s(1), task.s()).apply_async(headers={"aitp_tenant": "acme"})
    first = published[-1]
    assert first["headers"]["root_id"] == first["headers"]["id"] == result.parent.id


def test_coexistence_annotates_and_records_but_keeps_celerys_route(app, store, published):
    make_live(store, "aitp.acme.cpu.hi", stage="coexistence")
    refresh(app)
    app.tasks["tests.unit.conftest.urgent"].apply_async((1,), headers={"aitp_tenant": "acme"})
    msg = published[-1]
    assert msg["routing_key"] == "default-q"
    h = header(msg)
    assert h["routed"] is False and h["reason"] == "shadow" and h["stage"] == "coexistence"
    assert h["queue"] == "aitp.acme.cpu.hi"  # where it would have gone
    app.aitp.live.flush()
    record = store.read_records(store.keys.decisions)[-1]
    assert record["reason"] == "shadow" and record["queue"] == "aitp.acme.cpu.hi"


def test_a_stage_change_in_the_store_is_followed_at_the_next_refresh(app, store, published):
    make_live(store, "aitp.acme.cpu.hi", stage="coexistence")
    refresh(app)
    task = app.tasks["tests.unit.conftest.urgent"]
    task.apply_async((1,), headers={"aitp_tenant": "acme"})
    store.write_stage({"stage": "takeover", "split": {}}, who="test")
    task.apply_async((2,), headers={"aitp_tenant": "acme"})  # cached view: not yet
    app.aitp.live.refresh()
    task.apply_async((3,), headers={"aitp_tenant": "acme"})
    assert [m["routing_key"] for m in published[-3:]] == ["default-q", "default-q",
                                                          "aitp.acme.cpu.hi"]


def test_a_first_publish_leaves_out_origin_at_and_retries_keep_the_first_time(app, store,
                                                                              published):
    make_live(store, "aitp.acme.cpu.hi")
    refresh(app)
    task = app.tasks["tests.unit.conftest.urgent"]
    task.apply_async((1,), headers={"aitp_tenant": "acme"}, task_id="t-1")
    first = header(published[-1])
    assert "origin_at" not in first  # it equals decided_at

    def retry(received: dict, retries: int) -> dict:
        """Publish a retry from inside the running task, as Celery's Task.retry does."""
        running.enter(SimpleNamespace(id="t-1", aitp=received))
        try:
            task.apply_async((1,), headers={"aitp_tenant": "acme"}, task_id="t-1",
                             retries=retries)
        finally:
            running.leave()
        return header(published[-1])

    second = retry(first, 1)
    assert second["origin_at"] == first["decided_at"] < second["decided_at"]
    assert retry(second, 2)["origin_at"] == first["decided_at"]


def test_header_origin_reads_a_first_publish_time_or_nothing():
    from celery_aitp.core.request import header_origin

    assert header_origin({"decided_at": 5.0}) == 5.0  # a first publish: no origin_at
    assert header_origin({"origin_at": 2, "decided_at": 5.0}) == 2.0
    for odd in (None, [], {"origin_at": float("nan")}, {"decided_at": float("inf")},
                {"origin_at": True}, {"origin_at": -1.0}, {"origin_at": 10 ** 400},
                {"origin_at": "1.0"}):
        assert header_origin(odd) is None, odd
