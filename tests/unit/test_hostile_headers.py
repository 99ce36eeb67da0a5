"""Hostile message headers on the publish path, and forged ``aitp`` headers in the worker.

Properties, for any header values (``aitp_tenant``, ``aitp_labels``, a forged ``aitp``
header, Celery's own ``id``/``retries``/``root_id``/``argsrepr``/``kwargsrepr``, any
body): the middleware never raises; the message keeps a JSON-safe ``aitp`` header and goes
to a tier queue or to Celery's own route; the tenant is a policy tenant; the tier is never
above that tenant's ``max_tier``; a rejected tenant or label header is counted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import fakeredis
import pytest
from celery import Celery
from hypothesis import given
from hypothesis import strategies as st
from kombu import Queue

import celery_aitp
from celery_aitp.core import running
from celery_aitp.core.request import MAX_HEADER_CHARS, Request, header_origin, read_header
from celery_aitp.publish.hook import AUTO_ROUTE
from celery_aitp.queues import all_tier_queues, parse_tier_queue
from celery_aitp.store import Keys, RedisStore
from tests.unit.hostile import HOSTILE, Hostile, json_values, odd_floats, odd_text, py_values

POLICY: dict[str, Any] = {
    "tiers": [{"name": "hi", "sla_s": 1}, {"name": "mid", "sla_s": 10},
              {"name": "lo", "sla_s": 60}],
    "tenants": {"acme": {"max_tier": "hi", "sla_s": 0.5}, "globex": {"max_tier": "mid"},
                "default": {"max_tier": "lo"},
                "vip": {"max_tier": "hi", "trusted_header": False}},  # never from a header
    "accelerators": ["cpu", "gpu"],
    "labels": {"critical": 1.0, "billing": 0.9},
    "tenant_kwarg": "tenant",
    "stage": "takeover",
}
TENANTS = ("acme", "globex", "default")
ALL_TENANTS = TENANTS + ("vip",)
TASKS = ("h.urgent", "h.plain", "h.gpu", "h.unknown")


@pytest.fixture(scope="module")
def deployment() -> Iterator[Celery]:
    """An app in takeover whose every tier queue has a live worker (so routing happens)."""
    app = Celery("hostile", broker="memory://", backend="cache+memory://")
    app.conf.task_default_queue = "default-q"
    store = RedisStore(fakeredis.FakeRedis(), Keys("hostile"))
    mw = celery_aitp.install(app, policy=POLICY, store=store)

    @app.task(name="h.urgent", aitp={"tier": "hi", "labels": ["critical"]})
    def urgent(*args: Any, **kwargs: Any) -> None: ...

    @app.task(name="h.plain")
    def plain(*args: Any, **kwargs: Any) -> None: ...

    @app.task(name="h.gpu", aitp={"accelerator": "gpu", "tier": "mid", "runtime_hint_s": 0.01})
    def gpu(*args: Any, **kwargs: Any) -> None: ...

    queues = all_tier_queues(ALL_TENANTS, ("cpu", "gpu"), ("hi", "mid", "lo"))
    store.advertise("w1@hostile", queues, {}, ttl_s=3600)
    store.write_stage({"stage": "takeover", "split": {}}, who="test")
    mw.live.current()
    mw.live.refresh()
    yield app
    mw.close()


tenant_values = st.one_of(st.sampled_from(ALL_TENANTS + ("ACME", "acme ", "", "nobody")),
                          py_values)
label_values = st.one_of(
    st.lists(st.sampled_from(["critical", "billing", "nope", " critical"]), max_size=20),
    st.text(alphabet="critical,billng ", max_size=200), py_values)
aitp_header_values = st.one_of(
    st.fixed_dictionaries({}, optional={
        "origin_at": st.one_of(odd_floats, py_values), "decided_at": odd_floats,
        "tier": st.sampled_from(["hi", "mid", "lo", "top"]), "tenant": tenant_values,
        "routed": st.booleans(), "score": odd_floats}),
    py_values)
headers_strategy = st.fixed_dictionaries({}, optional={
    "aitp_tenant": tenant_values, "aitp_labels": label_values, "aitp": aitp_header_values,
    "aitp_tier": st.sampled_from(["hi", "top", 0]), "priority": py_values,
}) | py_values
message_headers = st.fixed_dictionaries({}, optional={
    "id": py_values, "retries": st.one_of(st.integers(-5, 10**6), py_values),
    "root_id": py_values, "argsrepr": st.one_of(odd_text, py_values),
    "kwargsrepr": st.one_of(odd_text, py_values)})
bodies = st.one_of(
    st.tuples(st.lists(py_values, max_size=5),
              st.dictionaries(st.one_of(odd_text, st.sampled_from(["tenant"])), py_values,
                              max_size=4),
              st.just({})),
    py_values)


def _rank(tier: str) -> int:
    return ("hi", "mid", "lo").index(tier)


def _cap(tenant: str) -> int:
    return _rank(POLICY["tenants"][tenant]["max_tier"])


def _no_constant(name: str) -> Any:
    raise AssertionError(f"{name} in the aitp header")


def _check_outcome(app: Celery, options: dict[str, Any]) -> dict[str, Any]:
    """The common part of every property: a valid header, a valid destination."""
    raw = options["headers"]["aitp"]
    assert type(raw) is str and len(raw) <= MAX_HEADER_CHARS
    header = json.loads(raw, parse_constant=_no_constant)  # strict: no NaN/inf smuggled in
    assert header == read_header(raw)
    if header["reason"].startswith("error:"):  # the decision itself failed: nothing decided
        assert (header["tenant"], header["tier"], header["routed"]) == ("", "", False)
    else:
        assert header["tenant"] in ALL_TENANTS and header["tier"] in ("hi", "mid", "lo")
    if header["tier"]:
        assert _rank(header["tier"]) >= _cap(header["tenant"]), header  # the cap holds
    queue = options.get("queue")
    if header["routed"]:
        assert isinstance(queue, Queue)
        assert parse_tier_queue(header["queue"]) == (header["tenant"], header["accelerator"],
                                                   header["tier"])
        assert queue.name == app.aitp.layout.physical(header["queue"])
    else:
        assert not isinstance(queue, Queue) or queue.name == "default-q"
    return header


@HOSTILE
@given(task=st.sampled_from(TASKS), headers=headers_strategy, msg_headers=message_headers,
       body=bodies, auto=st.booleans())
def test_on_publish_never_raises_and_never_raises_a_tier(deployment, task, headers, msg_headers,
                                                         body, auto):
    mw = deployment.aitp
    message = SimpleNamespace(headers=msg_headers, body=body)
    options: dict[str, Any] = {"headers": headers, "queue": "default-q"}
    if auto:
        options[AUTO_ROUTE] = True
    before = dict(mw.counters.totals)
    out = mw.on_publish(task, message, options)
    header = _check_outcome(deployment, out)
    assert header["tenant"] != "vip"  # trusted_header: false, and no running task here
    raw = headers.get("aitp_tenant") if type(headers) is dict else None
    if raw is not None and not (isinstance(raw, str) and raw in TENANTS):
        # a rejected tenant header is counted, and the task goes to the default tenant
        assert header["tenant"] == "default" or header["reason"].startswith("error:")
        rejected = sum(mw.counters.totals[k] - before.get(k, 0)
                       for k in ("tenant_invalid", "tenant_unknown", "tenant_refused"))
        assert rejected >= 1 or header["reason"].startswith("error:")
    if not auto:
        assert header["routed"] is False  # an explicit queue is always respected


@HOSTILE
@given(tenant=st.sampled_from(TENANTS), task=st.sampled_from(TASKS), headers=headers_strategy,
       retries=st.integers(0, 5))
def test_no_header_raises_a_tier_above_the_tenants_cap(deployment, tenant, task, headers,
                                                      retries):
    """The tenant is named correctly; everything else in the headers is hostile."""
    mw = deployment.aitp
    headers = dict(headers) if type(headers) is dict else {}
    headers["aitp_tenant"] = tenant
    headers["aitp_labels"] = "critical,billing"  # the most a caller could ask for
    message = SimpleNamespace(headers={"id": "t1", "retries": retries}, body=((), {}, {}))
    out = mw.on_publish(task, message, {"headers": headers, AUTO_ROUTE: True})
    header = _check_outcome(deployment, out)
    assert header["tenant"] == tenant
    assert header["reason"] == "routed"  # a live worker serves every tier queue
    assert _rank(header["tier"]) >= _cap(tenant)


@HOSTILE
@given(headers=st.dictionaries(st.sampled_from(["aitp_tenant", "aitp_labels", "custom"]),
                               json_values, max_size=3),
       args=st.lists(json_values, max_size=3))
def test_apply_async_with_hostile_headers_still_publishes(deployment, headers, args):
    """Through Celery itself: every call publishes exactly one message, to a real queue."""
    seen: list[dict[str, Any]] = []
    from celery.signals import after_task_publish

    def capture(sender: Any = None, headers: Any = None, routing_key: Any = None,
                **_: Any) -> None:
        seen.append({"headers": headers, "routing_key": routing_key})

    after_task_publish.connect(capture, weak=False)
    try:
        deployment.tasks["h.plain"].apply_async(args, headers=headers)
    finally:
        after_task_publish.disconnect(capture)
    assert len(seen) == 1
    header = read_header(seen[0]["headers"]["aitp"])
    assert header["tenant"] in TENANTS and _rank(header["tier"]) >= _cap(header["tenant"])
    assert seen[0]["routing_key"] in ("default-q", header["queue"])


def test_a_message_whose_id_cannot_be_printed_still_publishes(deployment):
    """Even the fallback's own bookkeeping must not raise on a hostile message."""
    message = SimpleNamespace(headers={"id": Hostile(), "retries": Hostile()}, body=Hostile())
    out = deployment.aitp.on_publish("h.plain", message, {"headers": {}, AUTO_ROUTE: True})
    assert read_header(out["headers"]["aitp"])["routed"] is False
    assert read_header(out["headers"]["aitp"])["reason"].startswith("error:")


# --- the worker side: a forged ``aitp`` header on a message it runs ------------------


@HOSTILE
@given(header=aitp_header_values)
def test_a_forged_running_tenant_never_reaches_a_sub_task_unchecked(deployment, header):
    """Sub-tasks inherit the running task's tenant only if it is a policy tenant."""
    running.enter(SimpleNamespace(aitp=header))
    try:
        message = SimpleNamespace(headers={"id": "sub"}, body=((), {}, {}))
        out = deployment.aitp.on_publish("h.urgent", message, {"headers": {}, AUTO_ROUTE: True})
    finally:
        running.leave()
    result = _check_outcome(deployment, out)
    forged = header.get("tenant") if type(header) is dict else None
    if not (type(forged) is str and forged in ALL_TENANTS):
        assert result["tenant"] == "default"


def test_odd_values_in_a_forged_origin_keep_it_finite_and_in_the_past(deployment):
    for origin in (math.nan, math.inf, -math.inf, True, 1e308, -1.0):
        message = SimpleNamespace(headers={"id": "r", "retries": 1}, body=((), {}, {}))
        out = deployment.aitp.on_publish(
            "h.plain", message,
            {"headers": {"aitp": {"origin_at": origin}}, AUTO_ROUTE: True})
        header = _check_outcome(deployment, out)
        origin = header.get("origin_at", header["decided_at"])  # left out when it is now
        assert math.isfinite(origin) and origin <= header["decided_at"]


def test_headers_that_are_not_a_mapping_are_replaced_counted_and_explained(deployment, caplog):
    mw = deployment.aitp
    before = mw.counters.totals["rejected:headers"]
    message = SimpleNamespace(headers={"id": "t"}, body=((), {}, {}))
    with caplog.at_level("WARNING", logger="celery_aitp.middleware"):
        out = mw.on_publish("h.listed", message, {"headers": ["aitp_tenant", "acme"],
                                                  AUTO_ROUTE: True})  # logged once a name
    assert set(out["headers"]) == {"aitp"}
    assert read_header(out["headers"]["aitp"])["tenant"] == "default"
    assert mw.counters.totals["rejected:headers"] == before + 1
    assert "rejected:headers" in caplog.text and "h.listed" in caplog.text


@HOSTILE
@given(raw=st.one_of(odd_text, st.binary(max_size=300), py_values, json_values.map(json.dumps),
                     st.integers(0, 5000).map(lambda n: '{"a":' * n)))
def test_any_aitp_header_reads_as_a_mapping_or_nothing(raw: Any) -> None:
    found = read_header(raw)
    assert found is None or isinstance(found, dict) or found is raw
    origin = header_origin(raw)
    assert origin is None or origin > 0
    assert read_header("x" * (MAX_HEADER_CHARS + 1)) is None


@pytest.mark.parametrize("fields, expected", [
    ({}, (0, None, None, None, None)),
    ({"retries": 2, "root_id": "r", "argsrepr": "(1,)", "kwargsrepr": "{}",
      "eta": "2026-01-01T00:00:00"}, (2, "r", 4, 2, "2026-01-01T00:00:00")),
    ({"retries": None, "root_id": "", "argsrepr": b"(1,)", "kwargsrepr": 7},
     (0, None, None, None, None)),
    ({"root_id": 5, "argsrepr": None}, (0, None, None, None, None)),
])
def test_celery_message_fields_of_the_wrong_type_read_as_absent(fields, expected) -> None:
    request = Request.of_message("t", "id", fields, (), {}, {}, {}, None, 1.0, None)
    assert (request.retries, request.root_id, request.args_bytes, request.kwargs_bytes,
            request.eta) == expected
