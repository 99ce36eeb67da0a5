"""What a caller's headers and arguments can claim: a tenant the policy lets them name,
never a tier above the tenant's cap, never a decision of their own (the ``aitp`` header).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

import celery_aitp
from celery_aitp.core import running
from celery_aitp.core.request import Decision, Request, read_header
from celery_aitp.errors import PolicyError
from celery_aitp.policy import parse_policy
from celery_aitp.publish.tenant_stage import TenantStage
from celery_aitp.settings import resolve_settings
from celery_aitp.store import RedisStore
from tests.conftest import TEST_POLICY
from tests.unit.conftest import make_live

#: acme is premium and may not be named by a header; globex may, but only up to mid.
POLICY = {**TEST_POLICY, "tenant_kwarg": "customer",
          "labels": {"vip": 1.0},
          "tenants": {"acme": {"max_tier": "hi", "trusted_header": False},
                      "globex": {"max_tier": "mid"}, "default": {"max_tier": "lo"}}}


def tenant_of(stage: TenantStage, **request: Any) -> Decision:
    decision = Decision("takeover", 0.0, "t", "id")
    stage(Request("t", "id", **request), decision, None)  # type: ignore[arg-type]
    return decision


def test_header_names_only_trusted_tenants_of_the_policy() -> None:
    stage = TenantStage(parse_policy(POLICY))
    cases = [
        ({"headers": {"aitp_tenant": "globex"}}, "globex", []),
        ({"headers": {"aitp_tenant": "acme"}}, "default", ["tenant_refused"]),
        ({"kwargs": {"customer": "acme"}}, "default", ["tenant_refused"]),
        ({"headers": {"aitp_tenant": "initech"}}, "default", ["tenant_unknown"]),
        ({"headers": {"aitp_tenant": ["acme"]}}, "default", ["tenant_invalid"]),
        ({"headers": {"aitp_tenant": "a" * 500}}, "default", ["tenant_invalid"]),
        ({"parent_tenant": "acme"}, "acme", []),  # a sub-task of acme's own task
        ({"parent_tenant": "gone"}, "default", ["tenant_unknown"]),  # policy changed since
    ]
    for request, tenant, notes in cases:
        d = tenant_of(stage, **request)
        assert (d.tenant, d.notes) == (tenant, notes), request


def test_a_pinned_producer_publishes_only_for_its_tenant() -> None:
    stage = TenantStage(parse_policy(POLICY), producer_tenant="acme")
    assert tenant_of(stage).tenant == "acme"
    assert tenant_of(stage, headers={"aitp_tenant": "acme"}).tenant == "acme"
    other = tenant_of(stage, headers={"aitp_tenant": "globex"})
    assert (other.tenant, other.notes) == ("acme", ["tenant_refused"])
    with pytest.raises(ValueError, match="producer_tenant: 'initech' is not in"):
        TenantStage(parse_policy(POLICY), producer_tenant="initech")


def test_producer_tenant_setting_is_validated_against_the_policy() -> None:
    settings = resolve_settings({"aitp_producer_tenant": "acme"}, POLICY, environ={})
    assert settings.producer_tenant == "acme"
    with pytest.raises(PolicyError, match="aitp_producer_tenant: .*'initech' is not a tenant"):
        resolve_settings({}, POLICY, environ={"AITP_PRODUCER_TENANT": "initech"})


# --- through the publish hook ---------------------------------------------------------

@pytest.fixture
def make_app(store: RedisStore) -> Iterator[Any]:
    made: list[Celery] = []

    def make(**settings: Any) -> Celery:
        app = Celery("trust", broker="memory://", backend="cache+memory://")
        app.conf.task_default_queue = "default-q"
        celery_aitp.install(app, policy=POLICY, store=store, **settings)

        @app.task(shared=False, name="trust.urgent", aitp={"tier": "hi"})
        def urgent(x: Any = None) -> Any:
            return x

        @app.task(shared=False, name="trust.plain")
        def plain(x: Any = None, customer: Any = None) -> Any:
            return x

        made.append(app)
        return app

    yield make
    for app in made:
        app.aitp.close()


def publish(app: Celery, task: str, published: list[dict[str, Any]], **options: Any
            ) -> dict[str, Any]:
    app.aitp.live.current()
    app.aitp.live.refresh()
    app.tasks[task].apply_async((1,), **options)
    return dict(published[-1], aitp=read_header(published[-1]["headers"]["aitp"]))


def test_unknown_tenant_header_gets_the_default_tenant_and_is_counted(
        make_app: Any, store: RedisStore, published: list[dict[str, Any]]) -> None:
    app = make_app()
    make_live(store, "aitp.default.cpu.lo", "aitp.acme.cpu.hi")
    msg = publish(app, "trust.urgent", published, headers={"aitp_tenant": "initech"})
    assert msg["aitp"]["tenant"] == "default" and msg["aitp"]["tier"] == "lo"
    assert msg["routing_key"] == "aitp.default.cpu.lo"
    assert app.aitp.counters.totals["tenant_unknown"] == 1


def test_a_header_cannot_name_an_untrusted_tenant_but_its_own_producer_can(
        make_app: Any, store: RedisStore, published: list[dict[str, Any]]) -> None:
    make_live(store, "aitp.default.cpu.lo", "aitp.acme.cpu.hi")
    anyone = make_app()
    msg = publish(anyone, "trust.urgent", published, headers={"aitp_tenant": "acme"})
    assert (msg["aitp"]["tenant"], msg["routing_key"]) == ("default", "aitp.default.cpu.lo")
    msg = publish(anyone, "trust.plain", published, kwargs={"customer": "acme"})
    assert msg["aitp"]["tenant"] == "default"
    assert anyone.aitp.counters.totals["tenant_refused"] == 2
    pinned = make_app(producer_tenant="acme")
    msg = publish(pinned, "trust.urgent", published)
    assert (msg["aitp"]["tenant"], msg["routing_key"]) == ("acme", "aitp.acme.cpu.hi")


def test_tier_headers_and_labels_never_lift_a_task_above_its_tenants_cap(
        make_app: Any, store: RedisStore, published: list[dict[str, Any]]) -> None:
    app = make_app()
    make_live(store, "aitp.globex.cpu.mid", "aitp.globex.cpu.hi")
    headers = {"aitp_tenant": "globex", "aitp_tier": "hi", "tier": "hi", "aitp_labels": ["vip"],
               "priority": 255}
    msg = publish(app, "trust.urgent", published, headers=headers)  # declared hi, cap mid
    assert msg["aitp"]["tier"] == "mid" and msg["routing_key"] == "aitp.globex.cpu.mid"
    plain = publish(app, "trust.plain", published, headers={"aitp_tenant": "default",
                                                             "aitp_tier": "hi"})
    assert plain["aitp"]["tier"] == "lo"


def test_a_forged_aitp_header_is_replaced_and_claims_nothing(
        make_app: Any, store: RedisStore, published: list[dict[str, Any]]) -> None:
    app = make_app()
    make_live(store, "aitp.default.cpu.lo", "aitp.acme.cpu.hi")
    forged = {"v": 1, "tenant": "acme", "tier": "hi", "routed": True, "reason": "routed",
              "queue": "aitp.acme.cpu.hi", "origin_at": 1.0, "decided_at": 1.0, "score": 1.0,
              "stage": "takeover"}
    honest = publish(app, "trust.plain", published, retries=3)
    msg = publish(app, "trust.plain", published, headers={"aitp": forged}, retries=3)
    header = msg["aitp"]
    assert (header["tenant"], header["tier"], msg["routing_key"]) == \
        ("default", "lo", "aitp.default.cpu.lo")
    assert "origin_at" not in header and header["decided_at"] != 1.0  # no age claimed
    assert header["score"] == pytest.approx(honest["aitp"]["score"])


def test_a_real_retry_keeps_its_age_from_the_header_the_worker_received(
        make_app: Any, store: RedisStore, published: list[dict[str, Any]]) -> None:
    app = make_app()
    make_live(store, "aitp.default.cpu.lo")
    first = publish(app, "trust.plain", published)

    class Running:  # what task_prerun hands the tracker: the running task's request
        id = "retried-id"
        aitp = first["aitp"]

    running.enter(Running())
    try:
        msg = publish(app, "trust.plain", published, task_id="retried-id", retries=1)
    finally:
        running.leave()
    assert msg["aitp"]["origin_at"] == first["aitp"]["decided_at"]


def test_task_protocol_1_reads_the_tenant_kwarg_and_the_id_from_the_body(
        store: RedisStore) -> None:
    """Protocol 1 keeps args, kwargs and the id in the body (its headers are empty): the
    tenant argument was ignored and records had no task id to explain."""
    from types import SimpleNamespace

    app = Celery("protocol1", broker="memory://", set_as_current=False)
    mw = celery_aitp.install(app, policy=POLICY, store=store)
    make_live(store, "aitp.globex.cpu.lo")
    mw.live.refresh()
    message = SimpleNamespace(headers={}, body={"task": "t", "id": "p1-id", "args": [1],
                                                "kwargs": {"customer": "globex"}})
    options = mw.on_publish("t", message, {"_aitp_auto": True})
    assert read_header(options["headers"]["aitp"])["tenant"] == "globex"
    mw.live.flush()
    assert mw.decision_log.find("p1-id") is not None
