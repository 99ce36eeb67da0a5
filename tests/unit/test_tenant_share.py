"""Tenants of a class share one decision per identity (publish/tenant_share.py).

Each decision the memo hands a tenant of a class must be the one the pipeline makes for
that tenant: its own name (header, record, fair-share charge), its own spec, fair share
and boost; only the tail's work is shared.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest

from celery_aitp.core.request import Decision, Request, read_header
from celery_aitp.core.view import View
from celery_aitp.policy import SplitSettings, Stage, parse_policy
from celery_aitp.publish.memo import DecisionMemo, Reused
from celery_aitp.publish.pipeline import Pipeline, default_stages
from celery_aitp.queues import all_tier_queues, lane_queues
from celery_aitp.scheduling.feedback import Boosts
from celery_aitp.scheduling.size_classes import SizeClasses, size_bin
from tests.conftest import TEST_POLICY

POLICY = parse_policy({**TEST_POLICY, "tenant_classes": {"small": {}, "gold": {"sla_s": 5}},
                       "unlisted_tenants": "small", "tenants": {
    "a": {"tenant_class": "small"}, "b": {"tenant_class": "small"},
    "c": {"tenant_class": "small"},
    "capped": {"tenant_class": "small", "max_tier": "lo"},  # its own cap in the class
    "g1": {"tenant_class": "gold"}, "g2": {"tenant_class": "gold"},
    "own": {}, "own2": {}, "default": {}}})
TENANTS = ("a", "b", "c", "capped", "g1", "g2", "own", "own2", "default", "new1", "new2")
LIVE = frozenset(all_tier_queues(("small", "gold", "own", "own2", "default"), ("cpu",),
                                 POLICY.tier_names))
#: ... and workers that read the classes' over-share lanes.
LANES = LIVE | frozenset(lane_queues(("small", "gold"), ("cpu",), POLICY.tier_names))


class Predict:
    name = "predict"

    def __call__(self, request: Request, decision: Decision, view: View) -> None:
        decision.predicted_runtime_s = decision.predicted_p90_s = 1.0
        decision.prediction_source = "test"


class Usage:
    def __init__(self, demoted: frozenset[str]) -> None:
        self.demoted = demoted


def view(boosts: Boosts = Boosts(), demoted: frozenset[str] = frozenset(),
         split: SplitSettings | None = None, live: frozenset[str] = LIVE) -> View:
    sources = {"sizes": SizeClasses({"cpu": (size_bin(0.25), size_bin(4.0))}),
               "boosts": boosts, "usage": Usage(demoted)}
    return View(live, Stage.SPLIT if split else Stage.TAKEOVER, split or SplitSettings(),
                True, sources=MappingProxyType(sources))


def pipeline() -> Pipeline:
    return Pipeline({**default_stages(POLICY), "predict": Predict()})


def request(tenant: str, i: int) -> Request:
    return Request("t", f"id-{tenant}-{i}", (), {}, {"aitp_tenant": tenant}, {}, None, 1.0)


def compare(v: View, tenants: tuple[str, ...] = TENANTS) -> int:
    """Decide each tenant's task through a memo and through the pipeline alone: the
    same header, record and charges. Returns how many times the memo ran the tail."""
    memo, plain = DecisionMemo(pipeline()), pipeline()
    ran = 0
    finish = memo.pipeline.finish

    def counting(*args: Any) -> None:
        nonlocal ran
        ran += 1
        finish(*args)

    memo.pipeline.finish = counting  # type: ignore[method-assign]
    for i in range(2):
        for tenant in tenants:
            req = request(tenant, i)
            got = memo.decide(req, v, 5.0)
            want = plain.decide(req, v, 5.0)
            assert isinstance(got, Reused)
            assert read_header(got.header()) == read_header(want.header()), tenant
            assert got.record() == want.record(), tenant
            assert got.record()["tenant"] == tenant
            mine = [tuple(p) for p in (memo.priority.usage.pending, memo.priority.sizes.pending)]
            theirs = [tuple(p) for p in (plain.stages[4].usage.pending,
                                         plain.stages[4].sizes.pending)]
            assert mine == theirs, tenant  # charged to this tenant's own fair share
    return ran


def test_tenants_of_a_class_run_the_tail_once_per_identity() -> None:
    ran = compare(view())
    # small (a, b, c, new1, new2), small capped at lo, gold (g1, g2), and each tenant
    # with queues of its own (own, own2, default)
    assert ran == 6


def test_the_decision_differs_where_the_tenants_do() -> None:
    memo = DecisionMemo(pipeline())
    v = view(boosts=Boosts({"b": 8.0}), demoted=frozenset({"c"}))
    tiers = {t: read_header(memo.decide(request(t, 0), v, 5.0).header())["tier"]
             for t in ("a", "b", "c", "capped", "new1")}
    assert tiers == {"a": "mid", "b": "hi", "c": "lo", "capped": "lo", "new1": "mid"}
    assert compare(v) == 8  # b (boosted) and c (over its share) on their own


def test_a_split_that_names_a_tenant_of_a_class_keeps_it_apart() -> None:
    split = SplitSettings(percent=100.0, tenants=("a",))
    memo = DecisionMemo(pipeline())
    v = view(split=split)
    routed = {t: memo.decide(request(t, 0), v, 5.0).template.routed for t in ("b", "a", "c")}
    assert routed == {"b": False, "a": True, "c": False}
    compare(v)


@pytest.mark.parametrize("claim", ["b", "nobody-listed", "capped"])
def test_a_header_never_gives_a_tenant_another_identitys_tier(claim: str) -> None:
    """A tenant whose claim is refused is decided as the tenant it gets, never as the
    class decision of the name it claimed."""
    memo = DecisionMemo(pipeline())
    v = view()
    memo.decide(request("a", 0), v, 5.0)  # the small class's decision is kept
    got = memo.decide(request(claim, 1), v, 5.0)
    want = pipeline().decide(request(claim, 1), v, 5.0)
    assert read_header(got.header()) == read_header(want.header())


@pytest.mark.parametrize("first", ["a", "b"])
def test_a_demoted_tenant_of_a_class_never_shares_a_decision_with_one_that_is_not(
        first: str) -> None:
    """Demoted (a, c) and not (b, new1) in one class, whichever decides first: the
    demoted go to the class's lane, the others keep the class's queues."""
    memo = DecisionMemo(pipeline())
    v = view(demoted=frozenset({"a", "c"}), live=LANES)
    order = [first, "b" if first == "a" else "a", "c", "new1"]
    queues = {t: read_header(memo.decide(request(t, 0), v, 5.0).header())["queue"]
              for t in order}
    assert queues == {"a": "aitp.small~over.cpu.lo", "c": "aitp.small~over.cpu.lo",
                      "b": "aitp.small.cpu.mid", "new1": "aitp.small.cpu.mid"}
    assert compare(v) == 7  # small demoted, small not, capped, gold, own, own2, default
