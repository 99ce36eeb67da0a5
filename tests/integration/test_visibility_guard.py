"""The visibility-timeout guard with real workers on real Redis.

A small ``visibility_timeout`` (8 s, guard margin 0.5: it acts above 4 s) and the policy's
``action: default_queue``: a countdown of 5 s is counted, warned about and sent to the
default queue, where a standard worker acknowledges it when it starts, before the timeout;
it runs exactly once. A countdown of 1 s stays on its tier queue.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.conftest import TEST_POLICY, cleanup_deployment, deployment_env, environment
from tests.support.live import wait_live

pytestmark = [pytest.mark.slow, pytest.mark.redis]

VISIBILITY_TIMEOUT_S = 8
TRANSPORT = {"visibility_timeout": VISIBILITY_TIMEOUT_S, "unacked_restore_interval": 1,
             "unacked_restore_throttle": 1}
POLICY = dict(TEST_POLICY, visibility_guard={"margin": 0.5, "action": "default_queue",
                                             "log_interval_s": 600})


@pytest.fixture
def deployment(redis_url: str) -> Iterator[dict[str, str]]:
    """The usual isolated deployment, with this module's policy and transport options."""
    tag = uuid.uuid4().hex[:8]
    env = deployment_env("redis", redis_url, tag, policy=POLICY)
    env["AITP_TEST_TRANSPORT_OPTIONS"] = json.dumps(TRANSPORT)
    with environment(env):
        yield env
    cleanup_deployment(env, redis_url, tag)


def deliveries(proj, task_id: str) -> int:
    raw = proj.tally_client().hget(f"{proj.PREFIX}:tally:deliveries", f"{task_id}:0")
    return int(raw or 0)


def test_a_long_countdown_is_counted_warned_diverted_and_runs_once(proj, start_worker, caplog):
    start_worker("acme", "--aitp-tenant", "acme", "--aitp-no-default-queue")
    start_worker("plain")
    wait_live(proj, "aitp.acme.cpu.hi")
    caplog.set_level(logging.WARNING, logger="celery_aitp.visibility")
    headers = {"aitp_tenant": "acme"}

    near = proj.where_hi.apply_async((1,), countdown=1, headers=headers).get(timeout=30)
    assert near["queue"] == "aitp.acme.cpu.hi" and near["aitp"]["reason"] == "routed"

    published = time.monotonic()
    far = proj.tally.apply_async((2,), countdown=5, headers=headers)
    deadline = published + 30
    while deliveries(proj, far.id) == 0:
        assert time.monotonic() < deadline, "the diverted task never ran"
        time.sleep(0.2)
    # a redelivery would come once the message was unacknowledged for visibility_timeout
    # (plus the 1 s restore sweep); wait past that and count again
    time.sleep(max(0.0, published + VISIBILITY_TIMEOUT_S + 3 - time.monotonic()))
    assert deliveries(proj, far.id) == 1
    queues = proj.tally_client().hgetall(f"{proj.PREFIX}:tally:queues")
    assert {k.decode(): int(v) for k, v in queues.items()} == {proj.app.conf.task_default_queue: 1}

    mw = proj.app.aitp
    assert mw.counters.totals["visibility_eta"] == 1
    assert mw.counters.totals["decisions:takeover:acme:hi:cpu:visibility_eta"] == 1
    mw.live.flush()
    assert mw.store.counts().get("visibility_eta") == 1  # the fleet's counter (dashboard)
    record = next(r for r in mw.store.read_records(mw.store.keys.decisions)
                  if r.get("task_id") == far.id)
    assert record["reason"] == "visibility_eta" and record["queue"] == "aitp.acme.cpu.hi"
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "tests.apps.proj.tally" in warnings[0]
    assert "visibility_timeout (8 s)" in warnings[0]
