"""Tenant classes with real workers: tenants of a class (listed or not) share the class's
tier queues under their own names; a class queue nobody serves any more is evacuated; a
demoted tenant of a class goes to the class's over-share lane."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from tests.conftest import TEST_POLICY, cleanup_deployment, deployment_env, environment
from tests.support.live import wait_live

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("broker", [pytest.param("redis", marks=pytest.mark.redis),
                                       pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)]),
]

#: acme has queues of its own; globex (listed) and any unlisted tenant share 'std'.
CLASS_POLICY = {
    **TEST_POLICY,
    "tenants": {"acme": {"max_tier": "hi", "weight": 2},
                "globex": {"max_tier": "mid", "tenant_class": "std"},
                "default": {"max_tier": "lo"}},
    "tenant_classes": {"std": {"max_tier": "mid"}},
    "unlisted_tenants": "std",
}


@pytest.fixture
def deployment(redis_url: str, broker: str) -> Iterator[dict[str, str]]:
    """The shared fixture's deployment, with the class policy."""
    tag = uuid.uuid4().hex[:8]
    env = deployment_env(broker, redis_url, tag, CLASS_POLICY)
    with environment(env):
        yield env
    cleanup_deployment(env, redis_url, tag, extra_queues=("aitp.std.cpu", "aitp.std.gpu"))


def delivered_from(broker: str, logical: str) -> str:
    """The broker queue: on RabbitMQ the owner's priority queue (a lane's is its class's)."""
    return logical if broker == "redis" else logical.rsplit(".", 1)[0].replace("~over", "")


def test_class_tenants_share_the_class_queue_under_their_own_names(proj, start_worker, broker):
    start_worker("all", "--aitp-tenant", "*", "--aitp-no-default-queue")
    start_worker("plain")
    wait_live(proj, "aitp.std.cpu.lo")

    listed = proj.where.apply_async((1,), headers={"aitp_tenant": "globex"}).get(timeout=20)
    unlisted = proj.where.apply_async((2,), headers={"aitp_tenant": "newco"}).get(timeout=20)
    own = proj.where.apply_async((3,), headers={"aitp_tenant": "acme"}).get(timeout=20)
    capped = proj.where_hi.apply_async((4,), headers={"aitp_tenant": "newco"}).get(timeout=20)

    for result, tenant in ((listed, "globex"), (unlisted, "newco")):
        assert result["queue"] == delivered_from(broker, "aitp.std.cpu.lo")
        assert result["aitp"]["tenant"] == tenant and result["aitp"]["routed"] is True
        assert result["hostname"].startswith("all-")
    assert own["queue"] == delivered_from(broker, "aitp.acme.cpu.lo")
    assert capped["aitp"]["tier"] == "mid"  # the class's max_tier, not the task's hi
    assert capped["aitp"]["queue"] == "aitp.std.cpu.mid"


def test_a_class_queue_nobody_serves_is_evacuated(proj, start_worker, broker):
    worker = start_worker("std", "--aitp-tenant", "std", "--aitp-no-default-queue")
    wait_live(proj, "aitp.std.cpu.lo")
    blocker = proj.lo.apply_async((0, 3.0), headers={"aitp_tenant": "newco"})
    time.sleep(0.5)
    queued = [proj.lo.apply_async((i,), headers={"aitp_tenant": f"c{i % 3}"})
              for i in range(1, 11)]
    worker.kill()
    start_worker("plain")
    results = [r.get(timeout=60) for r in queued]
    assert sorted(r["x"] for r in results) == list(range(1, 11))  # nothing lost
    del blocker  # it ran, or was redelivered; either way not this test's question


def test_a_demoted_tenant_of_a_class_goes_to_the_lane_and_is_served(proj, start_worker,
                                                                     broker):
    """A tenant of the class far above its fair share: its task lands in the class's
    over-share lane and a worker serving the class runs it; a quiet tenant of the same
    class keeps the class's queue."""
    start_worker("std", "--aitp-tenant", "std", "--aitp-no-default-queue")
    start_worker("plain")
    lane = "aitp.std~over.cpu.lo"
    wait_live(proj, lane)
    proj.where.apply_async((0,), headers={"aitp_tenant": "quiet"}).get(timeout=20)
    flooded = None
    for i in range(1, 200):  # usage reaches the producer's view in its next refresh
        result = proj.where.apply_async((i,), headers={"aitp_tenant": "flood"}).get(timeout=20)
        if result["aitp"]["queue"] == lane:
            flooded = result
            break
        time.sleep(0.1)
    assert flooded is not None, "the flooding tenant was never demoted"
    assert flooded["aitp"]["tenant"] == "flood" and flooded["aitp"]["routed"] is True
    assert flooded["queue"] == delivered_from(broker, lane)
    assert flooded["hostname"].startswith("std-")
    quiet = proj.where.apply_async((0,), headers={"aitp_tenant": "quiet"}).get(timeout=20)
    assert quiet["aitp"]["queue"] == "aitp.std.cpu.lo"
    assert quiet["queue"] == delivered_from(broker, "aitp.std.cpu.lo")
