"""Feedback: tenants missing their SLAs get a bounded boost, audited, seen by producers."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from celery_aitp.core.request import Request
from celery_aitp.core.view import View
from celery_aitp.policy import SplitSettings, Stage, parse_policy
from celery_aitp.priority_policy import FeedbackSettings, PlacementSettings
from celery_aitp.publish.pipeline import Pipeline, default_stages
from celery_aitp.scheduling.feedback import (
    Boosts,
    BoostSource,
    FeedbackPass,
    boost_history,
    boosts_key,
    miss_stats,
    next_boosts,
    wait_fields,
)
from celery_aitp.scheduling.size_classes import SizeClasses, size_bin
from celery_aitp.telemetry.counters import Counters
from celery_aitp.worker.ledger import RunLedger
from tests.conftest import TEST_POLICY

POLICY = parse_policy({**TEST_POLICY, "tenants": {
    "acme": {"max_tier": "hi"}, "globex": {"max_tier": "mid", "sla_s": 0.5}, "default": {}}})
SETTINGS = FeedbackSettings(max_miss_rate=0.05, max_boost=8, min_runs=20)


def test_a_miss_is_a_wait_past_the_tier_sla_or_the_tenants_tighter_one():
    assert wait_fields(POLICY, "acme", "hi", 0.5) == {"n:acme:hi": 1.0, "m:acme:hi": 0.0}
    assert wait_fields(POLICY, "acme", "hi", 1.5)["m:acme:hi"] == 1.0  # hi: 1 s
    assert wait_fields(POLICY, "globex", "mid", 0.7)["m:globex:mid"] == 1.0  # globex: 0.5 s
    for bad in (("nobody", "hi", 1.0), ("acme", "gold", 1.0), ("acme", "hi", None),
                ("acme", "hi", -1), ("acme", "hi", True), (None, "hi", 1.0)):
        assert wait_fields(POLICY, *bad) == {}, bad


def test_boosts_double_on_misses_halve_when_met_and_stay_bounded():
    stats = {"acme": (100.0, 20.0), "globex": (100.0, 1.0), "quiet": (5.0, 5.0),
             "mid": (100.0, 4.0)}
    boosts, changes = next_boosts(stats, {"globex": 4.0, "mid": 2.0}, SETTINGS)
    assert boosts == {"acme": 2.0, "globex": 2.0, "mid": 2.0}  # quiet: too few runs
    assert {c.tenant: (c.old, c.new) for c in changes} == {"acme": (1.0, 2.0),
                                                         "globex": (4.0, 2.0)}
    assert "20% of 100 recent runs" in next(c.why for c in changes if c.tenant == "acme")
    capped, _ = next_boosts({"acme": (100.0, 50.0)}, {"acme": 8.0}, SETTINGS)
    assert capped == {"acme": 8.0}
    idle, _ = next_boosts({}, {"acme": 2.0}, SETTINGS)
    assert idle == {}  # nothing ran: the boost relaxes back to 1


def test_miss_stats_ignore_junk_fields():
    stats = miss_stats({"n:acme:hi": 10.0, "m:acme:hi": 3.0, "m:acme:lo": 20.0,
                        "n:acme:lo": 5.0, "x:acme:hi": 9.0, "n:": 4.0, "n:b:hi": -1.0})
    assert stats == {"acme": (15.0, 15.0)}  # misses never above runs


def run_record(tenant: str, tier: str, wait_s: float) -> dict:
    return {"task": "t", "tenant": tenant, "tier": tier, "wait_s": wait_s, "runtime_s": 0.1}


def view_with(boosts: Boosts) -> View:
    sources = {"sizes": SizeClasses({"cpu": (size_bin(0.25), size_bin(4.0))}),
               "boosts": boosts}
    return View(frozenset(), Stage.TAKEOVER, SplitSettings(), True,
                sources=MappingProxyType(sources))


def test_missed_slas_reach_producers_as_a_higher_tier_and_are_audited(store):
    ledger = RunLedger(POLICY, Counters(), clock=lambda: 1000.0)
    for i in range(40):  # acme: half its hi-tier runs wait past 1 s
        ledger.add(run_record("acme", "hi", 2.0 if i % 2 else 0.1))
        ledger.add(run_record("globex", "mid", 0.1))
    ledger.flush(store)
    feedback = FeedbackPass(store, POLICY, interval_s=5)
    changes = feedback.step(now=1001.0)
    assert [(c.tenant, c.new) for c in changes] == [("acme", 2.0)]
    source = BoostSource(POLICY)
    boosts = source.fetch(store, Boosts())
    assert boosts.of("acme") == 2.0 and boosts.of("globex") == 1.0
    assert source.fetch(store, boosts) is boosts  # unchanged: the same object
    (entry,) = boost_history(store)
    assert entry["tenant"] == "acme" and entry["old"] == 1.0 and entry["new"] == 2.0
    assert entry["who"].startswith("feedback@") and "50% of 40" in entry["why"]

    class Predict:
        name = "predict"

        def __call__(self, request, decision, view):
            decision.predicted_runtime_s = decision.predicted_p90_s = 0.4

    pipeline = Pipeline({**default_stages(POLICY), "predict": Predict()})
    request = Request("t", "id", (), {}, {"aitp_tenant": "acme"}, {}, None, 1000.0)
    plain = pipeline.decide(request, view_with(Boosts()), 1000.0)
    boosted = pipeline.decide(request, view_with(boosts), 1000.0)
    assert (plain.tier, boosted.tier) == ("mid", "hi")
    assert boosted.tier_steps["boost"] == 2.0
    assert boosted.tier_steps["effective_size_s"] == \
        pytest.approx(plain.tier_steps["effective_size_s"] / 2)


def test_a_forged_boosts_hash_is_kept_to_the_policy(store):
    store.client.hset(boosts_key(store), mapping={"acme": "1e9", "nobody": "4", "globex": "x",
                                                  "default": "0.5"})
    assert BoostSource(POLICY).fetch(store, Boosts()).by_tenant == {
        "acme": POLICY.feedback.max_boost}


def test_the_placement_command_shows_boundaries_boosts_and_changes(store):
    import json

    from celery import Celery
    from click.testing import CliRunner

    import celery_aitp
    from celery_aitp.cli.celery_command import aitp
    from celery_aitp.scheduling.size_source import SizeSource

    app = Celery("placement-cli", broker="memory://")
    celery_aitp.install(app, policy=POLICY.model_copy(update={"placement": PlacementSettings()}))
    app.aitp.store = store
    sizes = SizeSource(app.aitp.policy.placement, 3)
    sizes.pending.extend([("cpu", 0.02)] * 80 + [("cpu", 1.0)] * 20 + [("gpu", 1.0)] * 5)
    sizes.fetch(store, SizeClasses())
    store.client.hset(boosts_key(store), "acme", "4")
    empty = CliRunner().invoke(aitp, ["placement"], obj=type("Ctx", (), {"app": app})())
    assert "no run measured yet" in empty.output
    ledger = RunLedger(app.aitp.policy, Counters())
    for tier, runtime in (("hi", 0.02), ("lo", 0.1)):
        ledger.add({"task": "t", "tenant": "acme", "runtime_s": runtime,
                    "accelerator": "cpu", "tier": tier})
    ledger.flush(store)
    result = CliRunner().invoke(aitp, ["placement", "--json"],
                                obj=type("Ctx", (), {"app": app})())
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    low, high = data["classes"]["cpu"]["bounds_s"]
    assert 0.02 < low <= high and low < 1.0  # the short mode apart from the long one
    assert data["classes"]["gpu"] == {"recent_sizes": 5.0, "bounds_s": None}  # < min_samples
    assert data["boosts"] == {"acme": 4.0} and data["tiers"] == ["hi", "mid", "lo"]
    assert data["read_charges"] == {"cpu.hi": {"mean_run_s": 0.02, "charge": 1.0},
                                    "cpu.lo": {"mean_run_s": 0.1, "charge": 5.0}}
    text = CliRunner().invoke(aitp, ["placement"], obj=type("Ctx", (), {"app": app})())
    assert text.exit_code == 0 and "acme" in text.output and "hi <" in text.output
    assert "read charges" in text.output and "cpu.lo" in text.output
