"""The visibility-timeout guard: policy, threshold, stage on fakes and through the hook."""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

import pytest
from celery import Celery

import celery_aitp
from celery_aitp.core.request import Decision, Request, read_header
from celery_aitp.errors import PolicyError
from celery_aitp.policy import VisibilityGuardSettings, parse_policy
from celery_aitp.publish.pipeline import Pipeline, default_stages
from celery_aitp.publish.visibility_stage import (
    KOMBU_DEFAULT_VISIBILITY_TIMEOUT_S,
    VisibilityStage,
    eta_timestamp,
    visibility_timeout_s,
)
from celery_aitp.store import RedisStore
from tests.conftest import TEST_POLICY
from tests.unit.conftest import make_live

NOW = 1_700_000_000.0
VIEW: Any = object()  # the stage does not read the view


def iso(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).isoformat()


def run(stage: VisibilityStage, eta: str | None = None, p50: float | None = None,
        p90: float | None = None, routed: bool = True, task: str = "proj.t") -> Decision:
    decision = Decision("takeover", NOW, task, "id")
    decision.predicted_runtime_s, decision.predicted_p90_s = p50, p90
    decision.routed, decision.reason = routed, "routed" if routed else "shadow"
    stage(Request(task, "id", eta=eta), decision, VIEW)
    return decision


def stage(timeout_s: float = 100.0, clock: Any = None, **settings: Any) -> VisibilityStage:
    return VisibilityStage(VisibilityGuardSettings(**settings), timeout_s,
                           clock or (lambda: 0.0))


# --- policy and threshold -------------------------------------------------------------

def test_policy_defaults_and_validation() -> None:
    guard = parse_policy({}).visibility_guard
    assert (guard.enabled, guard.margin, guard.action, guard.runtime) == (True, 0.8, "warn", "p90")
    with pytest.raises(PolicyError, match="visibility_guard: .*needs visibility_guard.queue"):
        parse_policy({"visibility_guard": {"action": "queue"}})
    with pytest.raises(PolicyError, match="must not be a tier queue"):
        parse_policy({"visibility_guard": {"action": "queue", "queue": "aitp.acme.cpu.hi"}})
    with pytest.raises(PolicyError, match="visibility_guard.margin"):
        parse_policy({"visibility_guard": {"margin": 1.5}})
    with pytest.raises(PolicyError, match="visibility_guard.action"):
        parse_policy({"visibility_guard": {"action": "drop"}})


def test_threshold_comes_from_transport_options_else_kombus_default() -> None:
    assert visibility_timeout_s({}) == KOMBU_DEFAULT_VISIBILITY_TIMEOUT_S == 3600.0
    assert visibility_timeout_s(None) == 3600.0
    assert visibility_timeout_s({"visibility_timeout": "120"}) == 120.0
    for bad in (0, -1, "soon", float("nan")):
        with pytest.raises(ValueError, match="visibility_timeout: expected a positive"):
            visibility_timeout_s({"visibility_timeout": bad})


@pytest.mark.parametrize(("url", "expected"), [
    ("redis://127.0.0.1:1/0", 3600.0), ("rediss://127.0.0.1:1/0", 3600.0),
    ("sentinel://127.0.0.1:1", 3600.0), ("amqp://guest@127.0.0.1:1//", None),
    ("memory://", None),
])
def test_only_redis_transports_get_the_guard(url: str, expected: float | None) -> None:
    app = Celery("v", broker=url)
    mw = celery_aitp.install(app, policy=TEST_POLICY, store_url="redis://127.0.0.1:1/0")
    assert mw.visibility_timeout_s == expected  # builds the transport, never connects
    names = [s.name for s in mw.pipeline.stages]
    assert ("visibility" in names) is (expected is not None)


def test_the_threshold_is_read_once_when_the_pipeline_is_built() -> None:
    app = Celery("v", broker="redis://127.0.0.1:1/0")
    app.conf.broker_transport_options = {"visibility_timeout": 50}
    mw = celery_aitp.install(app, policy=TEST_POLICY)
    guard = next(s for s in mw.pipeline.stages if s.name == "visibility")
    app.conf.broker_transport_options = {"visibility_timeout": 5000}
    assert guard.limit_s == 40.0  # type: ignore[attr-defined]
    assert next(s for s in mw.pipeline.stages if s.name == "visibility") is guard


def test_a_bad_timeout_is_a_config_error_not_a_crash(store: RedisStore,
                                                    published: list[dict[str, Any]]) -> None:
    app = redis_like(store, 100.0)
    app.conf.broker_transport_options = {"visibility_timeout": "an hour"}
    app.send_task("proj.t")
    assert read_header(published[-1]["headers"]["aitp"])["reason"] == "config_error"
    assert published[-1]["routing_key"] == "default-q"


def test_disabled_or_not_redis_means_no_stage() -> None:
    off = parse_policy({"visibility_guard": {"enabled": False}})
    assert "visibility" not in default_stages(off, visibility_timeout_s=10.0)
    assert "visibility" not in default_stages(parse_policy({}))
    assert Pipeline(default_stages(parse_policy({}), visibility_timeout_s=10.0)).stages[-1].name \
        == "visibility"


# --- the stage ------------------------------------------------------------------------

def test_nothing_near_the_limit_changes_nothing() -> None:
    guard = stage()  # limit 80 s
    for kwargs in ({}, {"p50": 10.0, "p90": 79.0}, {"eta": iso(NOW + 30), "p90": 40.0},
                   {"eta": iso(NOW - 500)}, {"eta": "not a date", "p90": 1.0}):
        d = run(guard, **kwargs)
        assert d.notes == [] and d.routed and d.reason == "routed", kwargs


def test_a_long_eta_is_counted_and_stays_routed_with_warn() -> None:
    d = run(stage(), eta=iso(NOW + 90))
    assert d.notes == ["visibility_eta"]
    assert d.routed and d.reason == "routed"


def test_eta_plus_predicted_run_counts_and_the_larger_part_names_the_reason() -> None:
    assert run(stage(), eta=iso(NOW + 50), p90=40.0).notes == ["visibility_eta"]
    assert run(stage(), eta=iso(NOW + 30), p90=60.0).notes == ["visibility_runtime"]
    assert run(stage(), p50=10.0, p90=85.0).notes == ["visibility_runtime"]


def test_runtime_quantile_is_the_policys() -> None:
    assert run(stage(runtime="p50"), p50=10.0, p90=85.0).notes == []
    assert run(stage(runtime="p50"), p50=81.0, p90=200.0).notes == ["visibility_runtime"]
    # with an ETA and no p90 the median is used
    assert run(stage(), eta=iso(NOW + 30), p50=60.0).notes == ["visibility_runtime"]


def test_margin_sets_the_limit() -> None:
    assert run(stage(margin=0.5), p90=55.0).notes == ["visibility_runtime"]
    assert run(stage(margin=1.0), p90=95.0).notes == []


def test_divert_actions_fall_back_routed_tasks_only() -> None:
    for action, extra in (("default_queue", {}), ("queue", {"queue": "long"})):
        d = run(stage(action=action, **extra), eta=iso(NOW + 200))
        assert not d.routed and d.reason == "visibility_eta" and d.notes == ["visibility_eta"]
        shadow = run(stage(action=action, **extra), eta=iso(NOW + 200), routed=False)
        assert shadow.reason == "shadow" and shadow.notes == ["visibility_eta"]


def test_naive_eta_is_utc() -> None:
    naive = datetime.fromtimestamp(NOW + 90, timezone.utc).replace(tzinfo=None).isoformat()
    assert eta_timestamp(naive) == pytest.approx(NOW + 90)
    assert eta_timestamp(12) is None and eta_timestamp("2026-13-45") is None


def test_warning_is_rate_limited_per_task_name(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    guard = stage(clock=lambda: now[0], log_interval_s=60)
    caplog.set_level(logging.WARNING, logger="celery_aitp.visibility")
    for _ in range(5):
        run(guard, eta=iso(NOW + 90), task="proj.a")
    run(guard, eta=iso(NOW + 90), task="proj.b")
    now[0] = 61.0
    run(guard, eta=iso(NOW + 90), task="proj.a")
    logged = [r.getMessage() for r in caplog.records]
    assert [m.split()[2] for m in logged] == ["proj.a", "proj.b", "proj.a"]
    assert "visibility_timeout (100 s)" in logged[0] and "visibility_eta" in logged[0]


# --- through the publish hook ---------------------------------------------------------

def redis_like(store: RedisStore, timeout_s: float, **guard: Any) -> Celery:
    """An app on the in-memory broker standing in for Redis, with this guard policy."""
    app = Celery("vis", broker="memory://", backend="cache+memory://")
    app.conf.task_default_queue = "default-q"
    app.conf.broker_transport_options = {"visibility_timeout": timeout_s}
    mw = celery_aitp.install(app, policy=dict(TEST_POLICY, visibility_guard=guard),
                             store=store)
    mw.broker_driver = "redis"  # type: ignore[misc]

    @app.task(shared=False, name="vis.urgent", aitp={"tier": "hi"})
    def urgent(x: Any = None) -> Any:
        return x

    return app


def publish_urgent(app: Celery, **options: Any) -> None:
    app.aitp.live.current()
    app.aitp.live.refresh()
    app.tasks["vis.urgent"].apply_async((1,), headers={"aitp_tenant": "acme"}, **options)


@pytest.mark.parametrize(("guard", "queue", "reason"), [
    ({}, "aitp.acme.cpu.hi", "routed"),
    ({"action": "default_queue"}, "default-q", "visibility_eta"),
    ({"action": "queue", "queue": "long-waits"}, "long-waits", "visibility_eta"),
])
def test_countdown_past_the_limit_through_the_hook(store: RedisStore,
                                                   published: list[dict[str, Any]],
                                                   guard: dict[str, Any], queue: str,
                                                   reason: str) -> None:
    app = redis_like(store, 100.0, **guard)
    make_live(store, "aitp.acme.cpu.hi")
    publish_urgent(app, countdown=30)  # well inside: routed
    assert published[-1]["routing_key"] == "aitp.acme.cpu.hi"
    publish_urgent(app, countdown=500)
    assert published[-1]["routing_key"] == queue
    header = read_header(published[-1]["headers"]["aitp"])
    assert header["reason"] == reason and header["queue"] == "aitp.acme.cpu.hi"
    totals = app.aitp.counters.totals
    assert totals["visibility_eta"] == 1
    assert totals[f"decisions:takeover:acme:hi:cpu:{reason}"] == (1 if reason != "routed" else 2)
    app.aitp.close()


def test_an_explicit_queue_is_kept_but_counted(store: RedisStore,
                                               published: list[dict[str, Any]]) -> None:
    app = redis_like(store, 100.0, action="default_queue")
    make_live(store, "aitp.acme.cpu.hi")
    publish_urgent(app, countdown=500, queue="mine")
    assert published[-1]["routing_key"] == "mine"
    assert read_header(published[-1]["headers"]["aitp"])["reason"] == "explicit_queue"
    assert app.aitp.counters.totals["visibility_eta"] == 1
    app.aitp.close()
