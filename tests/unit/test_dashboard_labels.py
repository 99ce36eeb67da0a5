"""Label values of the queue gauges: bounded by the policy, one place builds them."""

from __future__ import annotations

from celery_aitp.dashboard.labels import Bounds
from celery_aitp.policy import parse_policy
from tests.conftest import TEST_POLICY


def test_queue_labels_name_what_a_queue_holds_within_the_policy():
    b = Bounds(parse_policy(TEST_POLICY))
    tier = {"queue": "aitp.acme.gpu.hi", "kind": "tier", "tenant": "acme",
            "accelerator": "gpu", "tier": "hi"}
    assert b.queue_labels(tier) == ("aitp.acme.gpu.hi", "tier", "acme", "gpu", "hi")
    rabbit = {**tier, "queue": "aitp.acme.gpu", "tier": None}  # one queue holds every tier
    assert b.queue_labels(rabbit) == ("aitp.acme.gpu", "tier", "acme", "gpu", "all")
    default = {"queue": "celery", "kind": "default", "tenant": None, "accelerator": None,
               "tier": None}
    assert b.queue_labels(default) == ("celery", "default", "none", "none", "none")
    stranger = {**tier, "queue": "aitp.zed.tpu.top", "tenant": "zed", "accelerator": "tpu",
                "tier": "top"}  # another policy's queue, still advertised
    assert b.queue_labels(stranger)[2:] == ("other", "other", "other")
