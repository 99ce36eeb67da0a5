"""The priority stage: size classes, urgency factors, floors, caps, labels, fair share, age."""

from __future__ import annotations

import math
from types import MappingProxyType

import pytest

from celery_aitp.core.request import Request
from celery_aitp.core.view import View
from celery_aitp.errors import PolicyError
from celery_aitp.policy import SplitSettings, Stage, parse_policy
from celery_aitp.profiles.profile import ObservedProfile
from celery_aitp.profiles.store import ProfileBook
from celery_aitp.publish.pipeline import Pipeline, default_stages
from celery_aitp.publish.priority_stage import quantile_power
from celery_aitp.scheduling.size_classes import SizeClasses, size_bin
from celery_aitp.scheduling.usage import UsageSnapshot
from tests.conftest import TEST_POLICY

POLICY = parse_policy({**TEST_POLICY, "labels": {"billing": 0.9, "batch": 0.1}})


#: Boundaries on cpu at the bins of 0.25 s and 4 s: hi below, mid between, lo above.
CLASSES = SizeClasses({"cpu": (size_bin(0.25), size_bin(4.0))})


def view(demoted=(), profiles=None, classes=None) -> View:
    sources = {"profiles": ProfileBook(profiles or {}),
               "usage": UsageSnapshot(demoted=frozenset(demoted)),
               "sizes": classes or SizeClasses()}
    return View(frozenset(), Stage.TAKEOVER, SplitSettings(), True,
                sources=MappingProxyType(sources))


def decide(request: Request, policy=POLICY, snapshot=None, p50=None, p90=None, now=1000.0,
           source=None):
    stages = default_stages(policy)
    if p50 is not None or p90 is not None:
        class Predict:
            name = "predict"

            def __call__(self, request, decision, view):
                decision.predicted_runtime_s, decision.predicted_p90_s = p50, p90
                decision.prediction_source = source

        stages["predict"] = Predict()
    pipeline = Pipeline(stages)
    decision = pipeline.decide(request, snapshot or view(), now)
    return decision, stages["priority"]


def req(task="t", tenant="acme", declared=None, headers=None, retries=0) -> Request:
    h = {"aitp_tenant": tenant, **(headers or {})}
    return Request(task, "id", (), {}, h, declared or {}, None, 1000.0, retries)


def test_urgency_is_the_weighted_mean_of_the_factors_and_is_explained():
    d, _ = decide(req(declared={"tier": "mid"}), p50=1.0, p90=2.0)
    w = POLICY.priority.weights
    f = d.factors
    assert set(f) == {"tenant", "sla", "impact", "resources", "age"}
    assert f["tenant"] == 1.0  # acme may use the top tier
    assert f["sla"] == pytest.approx(1 - math.log(10 / 1) / math.log(60 / 1))  # mid: 10 s
    assert f["impact"] == 0 and f["resources"] == 0 and f["age"] == 0
    total = w.tenant + w.sla + w.impact + w.resources + w.age
    expected = (w.tenant * f["tenant"] + w.sla * f["sla"]) / total
    assert d.score == pytest.approx(expected)
    effective = 2.0 / POLICY.placement.urgency_range ** expected  # no model: the p90 field
    assert d.tier_steps == {"size": "lo", "effective_size_s": pytest.approx(effective),
                            "bounds_s": None, "bounds_of": "cpu", "floor": "mid",
                            "cap": "hi",
                            "fair_share": False, "boost": 1.0}
    assert d.tier == "mid"  # no boundaries yet: lowest by size, raised to the floor


def test_tiers_are_size_classes_ranked_by_the_predicted_median():
    """Shorter effective sizes take higher tiers. A model's prediction counts at the
    policy's quantile: the median by default (a wide spread does not make a task count
    as long), up to the p90 with a higher ``size_quantile``; a history estimate counts by
    its bound (its p90 field) whatever the quantile."""
    at = view(classes=CLASSES)
    short, _ = decide(req(), p50=0.05, p90=0.1, snapshot=at, source="model")
    medium, _ = decide(req(), p50=1.0, p90=1.0, snapshot=at, source="model")
    wide, _ = decide(req(), p50=0.05, p90=100.0, snapshot=at, source="model")
    assert (short.tier, medium.tier, wide.tier) == ("hi", "mid", "hi")
    assert wide.tier_steps["size"] == "hi"
    assert short.tier_steps["bounds_s"] == pytest.approx(list(CLASSES.bounds["cpu"]))
    cautious = {}
    for quantile in (0.75, 0.9):
        policy = parse_policy({**TEST_POLICY, "placement": {"size_quantile": quantile}})
        cautious[quantile], _ = decide(req(), policy, p50=0.05, p90=100.0, snapshot=at,
                                       source="model")
    assert (cautious[0.75].tier, cautious[0.9].tier) == ("mid", "lo")
    u = POLICY.placement.urgency_range ** cautious[0.9].score
    assert cautious[0.9].tier_steps["effective_size_s"] == pytest.approx(100.0 / u)
    bound, _ = decide(req(), p50=0.05, p90=100.0, snapshot=at, source="history")
    assert bound.tier_steps["effective_size_s"] == pytest.approx(100.0 / u)
    p50_only, _ = decide(req(), p50=0.1, snapshot=at)
    hint, _ = decide(req(declared={"runtime_hint_s": 0.05}), snapshot=at)
    assert p50_only.tier == hint.tier == "hi"
    nothing, _ = decide(req(), snapshot=at)
    nan, _ = decide(req(), p50=float("nan"), p90=float("nan"), snapshot=at)
    assert nothing.tier == nan.tier == "lo"  # nothing known: the lowest tier
    assert nothing.tier_steps["effective_size_s"] is None
    gpu = ObservedProfile(runs=5, accelerator="gpu", accelerator_share=1.0, accelerator_runs=5)
    other_class, _ = decide(req(task="render"), p50=0.05, p90=0.1, source="model",
                            snapshot=view(profiles={"render": gpu}, classes=CLASSES))
    assert other_class.tier == "lo"  # no boundaries for gpu yet


def test_cold_start_sizes_have_their_own_histogram_and_boundaries():
    # a model's p90 and the history's per-task bound are ranked, and counted, apart: a
    # model's first sizes are not ranked among the cold-start bounds of before
    model, stage = decide(req(), p50=0.05, p90=0.1, snapshot=view(classes=CLASSES),
                          source="model")
    assert model.tier == "hi"
    assert [c.item[0] for c in stage.charges_of(model)][1:] == ["cpu"]
    cold, stage = decide(req(), p50=0.05, p90=0.1, snapshot=view(classes=CLASSES),
                         source="history")
    assert [c.item[0] for c in stage.charges_of(cold)][1:] == ["cpu~history"]
    by_magnitude, stage = decide(req(), p50=0.05, p90=0.1, snapshot=view(classes=CLASSES),
                                 source="size_history")  # a magnitude class's bound
    assert [c.item[0] for c in stage.charges_of(by_magnitude)][1:] == ["cpu~history"]
    by_call, stage = decide(req(), p50=0.05, p90=0.1, snapshot=view(classes=CLASSES),
                            source="call_history")  # a repeated call's own runs
    assert [c.item[0] for c in stage.charges_of(by_call)][1:] == ["cpu~history"]
    both = SizeClasses({"cpu": CLASSES.cuts["cpu"],
                        "cpu~history": (size_bin(0.01), size_bin(0.05))})
    cold, _ = decide(req(), p50=0.05, p90=0.1, snapshot=view(classes=both),
                     source="task_history")
    assert cold.tier == "lo" and cold.tier_steps["bounds_s"] == pytest.approx(
        list(both.bounds["cpu~history"]))
    assert cold.tier_steps["bounds_of"] == "cpu~history"


def test_either_kind_of_size_stands_in_for_the_other_until_it_has_boundaries():
    """A newly promoted model's first sizes are ranked by the cold start's boundaries
    (not all sent to the lowest tier, behind the long work), and a cold-start size by
    the model's; each is still counted in its own histogram, and own boundaries win."""
    history_only = SizeClasses({"cpu~history": CLASSES.cuts["cpu"]})
    short, stage = decide(req(), p50=0.05, p90=0.1, snapshot=view(classes=history_only),
                          source="model")
    long, _ = decide(req(), p50=100.0, p90=100.0, snapshot=view(classes=history_only),
                     source="model")
    assert (short.tier, long.tier) == ("hi", "lo")
    assert short.tier_steps["bounds_of"] == "cpu~history"
    assert [c.item[0] for c in stage.charges_of(short)][1:] == ["cpu"]
    model_only = view(classes=CLASSES)
    cold, stage = decide(req(), p50=0.05, p90=0.1, snapshot=model_only, source="history")
    assert cold.tier == "hi" and cold.tier_steps["bounds_of"] == "cpu"
    assert [c.item[0] for c in stage.charges_of(cold)][1:] == ["cpu~history"]
    both = SizeClasses({"cpu": CLASSES.cuts["cpu"],
                        "cpu~history": (size_bin(0.01), size_bin(4.0))})
    own, _ = decide(req(), p50=0.05, p90=0.1, snapshot=view(classes=both), source="history")
    assert own.tier == "mid" and own.tier_steps["bounds_of"] == "cpu~history"


def test_urgency_shortens_the_effective_size():
    urgent = parse_policy({**TEST_POLICY, "labels": {"billing": 1.0},
                           "priority": {"weights": {"impact": 20}}})
    at = view(classes=CLASSES)
    plain, _ = decide(req(), urgent, p50=1.0, p90=1.0, snapshot=at)
    labelled, _ = decide(req(declared={"labels": ["billing"]}), urgent, p50=1.0, p90=1.0,
                         snapshot=at)
    assert plain.tier == "mid" and labelled.tier == "hi"
    assert labelled.tier_steps["effective_size_s"] < plain.tier_steps["effective_size_s"]
    flat = parse_policy({**TEST_POLICY, "labels": {"billing": 1.0},
                         "priority": {"weights": {"impact": 20}},
                         "placement": {"urgency_range": 1}})
    assert decide(req(declared={"labels": ["billing"]}), flat, p50=1.0, p90=1.0,
                  snapshot=at)[0].tier == "mid"


def test_no_header_raises_a_tenant_above_its_max_tier():
    urgent = parse_policy({**TEST_POLICY, "labels": {"billing": 1.0},
                           "priority": {"weights": {"impact": 50}}})
    d, _ = decide(req(tenant="globex", declared={"tier": "hi"},
                      headers={"aitp_labels": ["billing"], "aitp_tier": "hi",
                               "aitp": {"tier": "hi", "score": 1.0}}), urgent,
                  p50=0.01, p90=0.01, snapshot=view(classes=CLASSES))
    assert d.tier_steps["size"] == "hi"
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
    from celery_aitp.core import running

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


def test_every_decision_charges_fair_share_usage_and_sizes_in_the_background_batch():
    d, stage = decide(req(), p50=3.0)
    assert list(stage.usage.pending) == [("acme", "lo", 3.0)]
    assert list(stage.sizes.pending) == [("cpu", d.tier_steps["effective_size_s"])]
    _, stage = decide(req(tenant="globex"))
    assert list(stage.usage.pending) == [("globex", "lo", POLICY.fair_share.default_cost_s)]
    assert list(stage.sizes.pending) == []  # nothing known: no size to count


def test_cached_parts_follow_a_new_profile():
    stages = default_stages(POLICY)
    pipeline = Pipeline(stages)
    request = req(task="render")
    assert pipeline.decide(request, view(), 0.0).factors["resources"] == 0
    gpu = ObservedProfile(runs=5, accelerator="gpu", accelerator_share=1.0, accelerator_runs=5)
    later = pipeline.decide(request, view(profiles={"render": gpu}), 0.0)
    assert later.accelerator == "gpu" and later.factors["resources"] == 1.0


def test_a_quantile_between_the_median_and_the_p90_follows_the_log_normal_through_both():
    assert quantile_power(0.5) == pytest.approx(0.0, abs=1e-12)
    assert quantile_power(0.9) == pytest.approx(1.0)
    assert quantile_power(0.75) == pytest.approx(0.6745 / 1.2816, rel=1e-3)
    for bad in (0.4, 0.95):
        with pytest.raises(PolicyError, match="size_quantile"):
            parse_policy({**TEST_POLICY, "placement": {"size_quantile": bad}})


def test_boundaries_drawn_for_another_number_of_tiers_are_ignored():
    """A pipeline rebuilt for a policy with other tiers sees its predecessor's
    boundaries until its own source has fetched: three boundaries (four tiers) ranked a
    long task 3, past this policy's lowest tier (IndexError, and the task fell back)."""
    four_tiers = SizeClasses({"cpu": (size_bin(0.25), size_bin(1.0), size_bin(4.0))})
    d, _ = decide(req(), p90=100.0, snapshot=view(classes=four_tiers))
    assert d.tier == "lo" and d.tier_steps["bounds_s"] is None
    # a class whose boundaries fit keeps them beside one that does not
    mixed = SizeClasses({**four_tiers.cuts, "cpu~history": CLASSES.cuts["cpu"]})
    d, _ = decide(req(), p90=0.1, snapshot=view(classes=mixed))
    assert d.tier == "hi" and d.tier_steps["bounds_of"] == "cpu~history"
