"""The simple pipeline stages and the split arm assignment."""

from __future__ import annotations

from celery_aitp.core.request import Request
from celery_aitp.core.view import View
from celery_aitp.policy import SplitSettings, Stage, parse_policy
from celery_aitp.publish.pipeline import Pipeline, default_stages
from celery_aitp.publish.split import split_bucket
from tests.conftest import TEST_POLICY

POLICY = parse_policy(TEST_POLICY)


def decide(request: Request, live=(), stage=Stage.TAKEOVER, split=None, fresh=True):
    view = View(frozenset(live), stage, split or SplitSettings(), fresh)
    return Pipeline(default_stages(POLICY)).decide(request, view, 0.0)


def test_declared_accelerator_and_tier_with_tenant_cap():
    d = decide(Request("t", "id", headers={"aitp_tenant": "globex"},
                       declared={"tier": "hi", "accelerator": "gpu"}))
    assert (d.tenant, d.accelerator, d.tier) == ("globex", "gpu", "mid")
    assert d.queue == "aitp.globex.gpu.mid" and d.reason == "no_live_worker"


def test_unknown_declarations_use_defaults_and_are_noted():
    d = decide(Request("t", "id", declared={"tier": "gold", "accelerator": "tpu"}))
    assert (d.accelerator, d.tier) == ("cpu", "lo")
    assert d.notes == ["accelerator_unknown", "tier_unknown"]


def test_tenant_from_policy_kwarg():
    policy = parse_policy({**TEST_POLICY, "tenant_kwarg": "customer"})
    view = View(frozenset(), Stage.TAKEOVER, SplitSettings(), True)
    d = Pipeline(default_stages(policy)).decide(
        Request("t", "id", kwargs={"customer": "acme"}), view, 0.0)
    assert d.tenant == "acme"


def test_stale_view_falls_back_as_store_unreachable():
    d = decide(Request("t", "id"), live=["aitp.default.cpu.lo"], fresh=False)
    assert not d.routed and d.reason == "store_unreachable"


def test_split_is_deterministic_by_task_id_and_near_the_percentage():
    split = SplitSettings(percent=30)
    ids = [f"task-{i}" for i in range(1000)]
    arms = [decide(Request("t", i), live=["aitp.default.cpu.lo"], stage=Stage.SPLIT,
                   split=split).routed for i in ids]
    assert 250 <= sum(arms) <= 350
    again = [decide(Request("t", i), live=["aitp.default.cpu.lo"], stage=Stage.SPLIT,
                    split=split).routed for i in ids]
    assert arms == again
    assert all(0 <= split_bucket(i) < 100 for i in ids)


def test_split_selectors_limit_the_routed_arm():
    split = SplitSettings(percent=100, tenants=("acme",), tasks=("billing.*",))
    live = ["aitp.acme.cpu.lo", "aitp.globex.cpu.lo"]
    yes = decide(Request("billing.charge", "1", headers={"aitp_tenant": "acme"}), live,
                 Stage.SPLIT, split)
    wrong_task = decide(Request("mail.send", "1", headers={"aitp_tenant": "acme"}), live,
                        Stage.SPLIT, split)
    wrong_tenant = decide(Request("billing.charge", "1", headers={"aitp_tenant": "globex"}),
                          live, Stage.SPLIT, split)
    assert yes.routed and yes.arm == "routed"
    assert not wrong_task.routed and wrong_task.reason == "split_standard_arm"
    assert not wrong_tenant.routed


def test_coexistence_never_routes_but_keeps_the_would_be_queue():
    d = decide(Request("t", "id"), live=["aitp.default.cpu.lo"], stage=Stage.COEXISTENCE)
    assert not d.routed and d.reason == "shadow" and d.queue == "aitp.default.cpu.lo"


def test_pipeline_rejects_unknown_stage_names():
    import pytest

    with pytest.raises(ValueError, match="unknown pipeline stages"):
        Pipeline({"bogus": object()})  # type: ignore[dict-item]
