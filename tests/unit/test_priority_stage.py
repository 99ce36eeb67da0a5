"""The priority matrix: factors, weights, tier mapping, caps, labels, fair share, age."""

from __future__ import annotations

import math
from types import MappingProxyType

import pytest

from celery_aitp.policy import SplitSettings, Stage, parse_policy
from celery_aitp.profiles.profile import ObservedProfile
from celery_aitp.profiles.store import ProfileBook
from celery_aitp.publish.live_view import View
from celery_aitp.publish.pipeline import Pipeline, default_stages
from celery_aitp.publish.request import Request
from celery_aitp.scheduling.usage import UsageSnapshot
from tests.conftest import TEST_POLICY

POLICY = parse_policy({**TEST_POLICY, "labels": {"billing": 0.9, "batch": 0.1}})


def view(demoted=(), profiles=None) -> View:
    sources = {"profiles": ProfileBook(profiles or {}),
               "usage": UsageSnapshot(demoted=frozenset(demoted))}
    return View(frozenset(), Stage.TAKEOVER, SplitSettings(), True,
                sources=MappingProxyType(sources))


def decide(request: Request, policy=POLICY, snapshot=None, p50=None, p90=None, now=1000.0):
    stages = default_stages(policy)
    if p50 is not None or p90 is not None:
        class Predict:
            name = "predict"

            def __call__(self, request, decision, view):
                decision.predicted_runtime_s, decision.predicted_p90_s = p50, p90

        stages["predict"] = Predict()
    pipeline = Pipeline(stages)
    decision = pipeline.decide(request, snapshot or view(), now)
    return decision, stages["priority"]


def req(task="t", tenant="acme", declared=None, headers=None, retries=0) -> Request:
    h = {"aitp_tenant": tenant, **(headers or {})}
    return Request(task, "id", (), {}, h, declared or {}, None, 1000.0, retries)


def test_score_is_the_weighted_mean_of_the_factors_and_is_explained():
    d, _ = decide(req(declared={"tier": "mid"}), p50=1.0, p90=2.0)
    w = POLICY.priority.weights
    f = d.factors
    assert f["tenant"] == 1.0  # acme may use the top tier
    assert f["sla"] == pytest.approx(1 - math.log(10 / 1) / math.log(60 / 1))  # mid: 10 s
    assert f["runtime"] == pytest.approx(1 - math.log(2.0 / 0.1) / math.log(3600 / 0.1))
    assert f["impact"] == 0 and f["resources"] == 0 and f["age"] == 0
    total = w.tenant + w.sla + w.impact + w.resources + w.runtime + w.age
    expected = (w.tenant * f["tenant"] + w.sla * f["sla"] + w.runtime * f["runtime"]) / total
    assert d.score == pytest.approx(expected)
    assert d.tier_steps == {"score": "mid", "floor": "mid", "cap": "hi", "fair_share": False}
    assert d.tier == "mid"


def test_the_upper_quantile_is_used_and_missing_predictions_are_handled():
    low_p90, _ = decide(req(), p50=1.0, p90=100.0)
    p50_only, _ = decide(req(), p50=1.0)
    hint, _ = decide(req(declared={"runtime_hint_s": 0.05}))
    nothing, _ = decide(req())
    assert low_p90.factors["runtime"] < p50_only.factors["runtime"]  # p90 wins over p50
    assert hint.factors["runtime"] == 1.0  # at or below runtime_min_s
    assert nothing.factors["runtime"] == 0.5  # neutral when nothing is known
    nan, _ = decide(req(), p50=float("nan"), p90=float("nan"))
    assert nan.factors["runtime"] == 0.5


def test_weights_and_min_scores_from_the_policy_move_the_tier():
    urgent = parse_policy({**TEST_POLICY, "labels": {"billing": 1.0},
                           "priority": {"weights": {"impact": 20}}})
    plain, _ = decide(req(), urgent)
    labelled, _ = decide(req(declared={"labels": ["billing"]}), urgent)
    assert plain.tier == "lo" and labelled.tier == "hi"
    strict = parse_policy({**TEST_POLICY, "tiers": [
        {"name": "hi", "sla_s": 1, "min_score": 0.99}, {"name": "mid", "sla_s": 10,
                                                        "min_score": 0.98},
        {"name": "lo", "sla_s": 60}], "labels": {"billing": 1.0},
        "priority": {"weights": {"impact": 20}}})
    assert decide(req(declared={"labels": ["billing"]}), strict)[0].tier == "lo"


def test_no_header_raises_a_tenant_above_its_max_tier():
    urgent = parse_policy({**TEST_POLICY, "labels": {"billing": 1.0},
                           "priority": {"weights": {"impact": 50}}})
    d, _ = decide(req(tenant="globex", declared={"tier": "hi"},
                      headers={"aitp_labels": ["billing"], "aitp_tier": "hi",
                               "aitp": {"tier": "hi", "score": 1.0}}), urgent)
    assert d.factors["impact"] == 1.0
    assert d.tier == "mid" and d.tier_steps["cap"] == "mid"  # globex: max_tier mid


def test_header_labels_are_validated_against_the_policy():
    ok, _ = decide(req(headers={"aitp_labels": "billing, batch"}))
    assert ok.factors["impact"] == 0.9 and ok.notes == []
    unknown, _ = decide(req(headers={"aitp_labels": ["vip", "batch"]}))
    assert unknown.factors["impact"] == 0.1 and unknown.notes == ["labels_unknown"]
    bad, _ = decide(req(headers={"aitp_labels": {"billing": 1}}))
    assert bad.factors["impact"] == 0 and bad.notes == ["labels_invalid"]
    many, _ = decide(req(headers={"aitp_labels": ["billing"] * 17}))
    assert many.notes == ["labels_invalid"]
    off = parse_policy({**TEST_POLICY, "labels": {"billing": 0.9},
                        "priority": {"header_labels": False}})
    ignored, _ = decide(req(headers={"aitp_labels": ["billing"]}), off)
    assert ignored.factors["impact"] == 0 and ignored.notes == ["labels_ignored"]
    declared, _ = decide(req(declared={"labels": ["billing"], "impact": 0.95}))
    assert declared.factors["impact"] == 0.95


def test_declared_tier_is_a_floor_and_unknown_tiers_are_noted():
    assert decide(req(declared={"tier": "hi"}))[0].tier == "hi"
    unknown, _ = decide(req(declared={"tier": "gold"}))
    assert unknown.tier == "lo" and unknown.notes == ["tier_unknown"]
    floored = parse_policy({**TEST_POLICY, "default_tier": "mid"})
    assert decide(req(), floored)[0].tier == "mid"


def test_a_tenant_above_its_fair_share_drops_one_tier_but_never_below_the_lowest():
    d, _ = decide(req(declared={"tier": "hi"}), snapshot=view(demoted={"acme"}))
    assert d.tier == "mid" and d.tier_steps["fair_share"] is True
    low, _ = decide(req(), snapshot=view(demoted={"acme"}))
    assert low.tier == "lo" and low.tier_steps["fair_share"] is False
    other, _ = decide(req(tenant="globex", declared={"tier": "mid"}),
                      snapshot=view(demoted={"acme"}))
    assert other.tier == "mid"
    off = parse_policy({**TEST_POLICY, "fair_share": {"enabled": False}})
    assert decide(req(declared={"tier": "hi"}), off, view(demoted={"acme"}))[0].tier == "hi"


def test_resource_demand_from_an_observed_gpu_profile():
    gpu = ObservedProfile(runs=5, cpu_s=1.0, cpu_cores=1.0, memory_mb=256.0,
                          accelerator="gpu", accelerator_share=1.0, accelerator_runs=5)
    d, _ = decide(req(task="render"), snapshot=view(profiles={"render": gpu}))
    assert d.accelerator == "gpu" and d.factors["resources"] == 1.0
    assert d.profile["sources"]["accelerator"] == "observed"
    small = parse_policy({**TEST_POLICY, "priority": {"favor_small": True}})
    assert decide(req(task="render"), small, view(profiles={"render": gpu}))[0] \
        .factors["resources"] == 0.0
    heavy, _ = decide(req(declared={"memory_mb": 2048, "cpu": 1}))
    assert heavy.factors["resources"] == pytest.approx(2048 / 4096)


class _Running:
    """What Celery hands ``task_prerun``: the running task's id and its aitp header."""

    def __init__(self, task_id: str, header: dict) -> None:
        self.id, self.aitp = task_id, header


def test_retries_keep_their_origin_and_age_raises_the_score():
    from celery_aitp.worker import running

    first, _ = decide(req())
    assert first.origin_at == 1000.0 and first.factors["age"] == 0
    retry = req(retries=2)
    running.enter(_Running("id", {"decided_at": 800.0, "origin_at": 400.0}))
    try:  # a retry is published by the task it retries, inside the worker
        d, _ = decide(retry, now=1000.0)
        assert d.origin_at == 400.0 and d.factors["age"] == 1.0  # 600 s = max_age_s
        assert d.score > first.score
        future = req(retries=1)
        running.enter(_Running("id", {"origin_at": 5000.0}))
        assert decide(future)[0].factors["age"] == 0
        running.enter(_Running("other-id", {"origin_at": 400.0}))  # another task's age
        assert decide(req(retries=1))[0].factors["age"] == 0
    finally:
        running.leave()


def test_a_forged_aitp_header_cannot_claim_age():
    """A caller's own ``aitp`` header (any origin_at) with ``retries=`` raises nothing."""
    for forged in ({"origin_at": 400.0, "decided_at": 400.0}, {"origin_at": "yesterday"},
                   {"origin_at": 5000.0}):
        d, _ = decide(req(retries=3, headers={"aitp": forged}), now=1000.0)
        assert d.factors["age"] == 0 and d.origin_at == 1000.0, forged


def test_every_decision_charges_fair_share_usage_in_the_background_batch():
    _, stage = decide(req(), p50=3.0)
    assert list(stage.usage.pending) == [("acme", "lo", 3.0)]
    _, stage = decide(req(tenant="globex"))
    assert list(stage.usage.pending) == [("globex", "lo", POLICY.fair_share.default_cost_s)]


def test_cached_parts_follow_a_new_profile():
    stages = default_stages(POLICY)
    pipeline = Pipeline(stages)
    request = req(task="render")
    assert pipeline.decide(request, view(), 0.0).factors["resources"] == 0
    gpu = ObservedProfile(runs=5, accelerator="gpu", accelerator_share=1.0, accelerator_runs=5)
    later = pipeline.decide(request, view(profiles={"render": gpu}), 0.0)
    assert later.accelerator == "gpu" and later.factors["resources"] == 1.0
