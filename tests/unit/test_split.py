"""The split stage: percentage by arm key, selectors, and the compiled rule."""

from __future__ import annotations

import uuid

import pytest

from celery_aitp.core.request import Request
from celery_aitp.core.view import View
from celery_aitp.policy import SplitSettings, Stage, parse_policy
from celery_aitp.publish.pipeline import Pipeline, default_stages
from celery_aitp.publish.split import SplitRule, arm_key, split_bucket
from tests.conftest import TEST_POLICY

POLICY = parse_policy(TEST_POLICY)
LIVE = frozenset({"aitp.default.cpu.lo", "aitp.acme.cpu.hi", "aitp.acme.cpu.lo",
                  "aitp.globex.cpu.mid"})


def decide(request: Request, split: SplitSettings, pipeline: Pipeline | None = None):
    view = View(LIVE, Stage.SPLIT, split, True)
    return (pipeline or Pipeline(default_stages(POLICY))).decide(request, view, 0.0)


def test_thirty_percent_of_a_thousand_uuid_tasks_is_routed_and_stable():
    split = SplitSettings(percent=30)
    pipeline = Pipeline(default_stages(POLICY))
    ids = [str(uuid.UUID(int=i * 7919 + 12345)) for i in range(1000)]
    first = [decide(Request("t", i), split, pipeline).arm for i in ids]
    assert 250 <= first.count("routed") <= 350
    assert first == [decide(Request("t", i), split, pipeline).arm for i in ids]
    # another process (a fresh pipeline) assigns the same arms
    assert first == [decide(Request("t", i), split).arm for i in ids]


def test_a_chain_step_takes_the_arm_of_its_root_and_a_retry_keeps_its_own():
    split = SplitSettings(percent=50)
    roots = [str(uuid.uuid4()) for _ in range(200)]
    for root in roots:
        first = decide(Request("t", root, root_id=root), split)
        step = decide(Request("t", str(uuid.uuid4()), root_id=root), split)
        retry = decide(Request("t", root, root_id=root, retries=1), split)
        assert first.arm == step.arm == retry.arm
    arms = {decide(Request("t", r, root_id=r), split).arm for r in roots}
    assert arms == {"routed", "standard"}


def test_arm_key_prefers_the_root_id():
    assert arm_key("own", "root") == "root"
    assert arm_key("own", None) == "own" and arm_key("own", "") == "own"


def test_zero_and_hundred_percent_are_exact():
    ids = [str(uuid.uuid4()) for _ in range(300)]
    assert all(decide(Request("t", i), SplitSettings(percent=0)).arm == "standard" for i in ids)
    assert all(decide(Request("t", i), SplitSettings(percent=100)).routed for i in ids)


def test_tier_selector_uses_the_decided_tier():
    split = SplitSettings(percent=100, tiers=("hi",))
    hi = decide(Request("t", "1", headers={"aitp_tenant": "acme"}, declared={"tier": "hi"}),
                split)
    capped = decide(Request("t", "1", headers={"aitp_tenant": "globex"},
                            declared={"tier": "hi"}), split)  # globex is capped at mid
    assert hi.routed and hi.arm == "routed"
    assert not capped.routed and capped.arm == "standard"


@pytest.mark.parametrize(("p50", "p90", "selected"), [
    (1.0, 1.4, True), (1.0, 1.5, True), (1.0, 3.0, False), (None, None, False), (0.0, 1.0, False),
])
def test_uncertainty_selector_routes_only_confident_predictions(p50, p90, selected):
    rule = SplitRule(SplitSettings(percent=100, max_uncertainty=1.5))
    assert rule.routes("k", "t", "default", "lo", p50, p90) is selected


def test_task_globs_are_compiled_like_fnmatch():
    rule = SplitRule(SplitSettings(percent=100, tasks=("billing.*", "mail.send_?")))
    assert rule.selects("billing.charge", None, None, None, None)
    assert rule.selects("mail.send_1", None, None, None, None)
    assert not rule.selects("mail.send_10", None, None, None, None)
    assert not rule.selects("xbilling.charge", None, None, None, None)
    assert not rule.selects("Billing.charge", None, None, None, None)  # case-sensitive


def test_gate_recompiles_only_when_the_split_object_changes():
    pipeline = Pipeline(default_stages(POLICY))
    gate = next(s for s in pipeline.stages if s.name == "gate")
    first = SplitSettings(percent=100, tenants=("acme",))
    decide(Request("t", "1", headers={"aitp_tenant": "acme"}), first, pipeline)
    rule = gate._rule  # type: ignore[attr-defined]
    decide(Request("t", "2", headers={"aitp_tenant": "acme"}), first, pipeline)
    assert gate._rule is rule  # type: ignore[attr-defined]
    other = SplitSettings(percent=100, tenants=("globex",))
    d = decide(Request("t", "3", headers={"aitp_tenant": "acme"}), other, pipeline)
    assert gate._rule is not rule and d.arm == "standard"  # type: ignore[attr-defined]


def test_bucket_is_in_range_and_spread():
    buckets = [split_bucket(str(uuid.UUID(int=i))) for i in range(2000)]
    assert all(0 <= b < 100 for b in buckets)
    assert 900 <= sum(b < 50 for b in buckets) <= 1100
