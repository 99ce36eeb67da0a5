"""Broker layouts: where a logical tier queue lives and with which message priority."""

from __future__ import annotations

import pytest

from celery_aitp.layout import (
    AMQP_MAX_PRIORITY,
    PerTenantLayout,
    PerTierLayout,
    layout_for,
    physical_groups,
    physical_of_all,
)


def test_redis_keeps_one_broker_queue_per_tier_and_one_priority():
    layout = layout_for("redis", ["hi", "mid", "lo"])
    assert isinstance(layout, PerTierLayout)
    assert layout.physical("aitp.acme.cpu.hi") == "aitp.acme.cpu.hi"
    assert layout.priority("aitp.acme.cpu.hi") == layout.priority("aitp.acme.cpu.lo") == 0
    assert isinstance(layout_for("memory", ["hi"]), PerTierLayout)
    assert isinstance(layout_for("sqs", ["hi"]), PerTierLayout)  # only RabbitMQ differs


def test_rabbitmq_puts_every_tier_of_a_tenant_and_accelerator_in_one_priority_queue():
    layout = layout_for("amqp", ["hi", "mid", "lo"])
    assert isinstance(layout, PerTenantLayout)
    assert {layout.physical(f"aitp.acme.gpu.{t}") for t in ("hi", "mid", "lo")} == {
        "aitp.acme.gpu"}
    assert layout.priority("aitp.acme.gpu.hi") > layout.priority("aitp.acme.gpu.mid") > \
        layout.priority("aitp.acme.gpu.lo") > 0
    assert layout.physical("celery") == "celery"  # not a tier queue: unchanged
    assert layout.is_tier_destination("aitp.acme.gpu")
    assert not layout.is_tier_destination("aitp.acme.gpu.hi.x")


def test_rabbitmq_declaration_does_not_depend_on_the_policy():
    """A producer and a worker with different tier lists must still declare alike."""
    three = PerTenantLayout(["hi", "mid", "lo"]).declaration("aitp.acme.cpu")
    one = PerTenantLayout(["only"]).declaration("aitp.acme.cpu")
    assert three.queue_arguments == one.queue_arguments == {"x-max-priority": AMQP_MAX_PRIORITY}
    assert three.exchange.name == three.routing_key == "aitp.acme.cpu"
    assert three.durable and not three.auto_delete


def test_more_tiers_than_rabbitmq_priorities_are_refused():
    with pytest.raises(ValueError, match="tiers"):
        PerTenantLayout([f"t{i}" for i in range(AMQP_MAX_PRIORITY + 1)])


def test_physical_groups_keep_tier_order():
    layout = PerTenantLayout(["hi", "lo"])
    groups = physical_groups(layout, ["aitp.a.cpu.hi", "aitp.b.cpu.hi", "aitp.a.cpu.lo"])
    assert groups == {"aitp.a.cpu": ["aitp.a.cpu.hi", "aitp.a.cpu.lo"],
                      "aitp.b.cpu": ["aitp.b.cpu.hi"]}
    every = physical_of_all(layout, ["a", "b"], ["cpu", "gpu"], ["hi", "lo"])
    assert sorted(every) == ["aitp.a.cpu", "aitp.a.gpu", "aitp.b.cpu", "aitp.b.gpu"]
    assert every["aitp.b.gpu"] == ["aitp.b.gpu.hi", "aitp.b.gpu.lo"]
