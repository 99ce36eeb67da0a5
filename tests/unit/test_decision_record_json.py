"""Decision records are encoded off the publish path by a fast encoder: same content."""

from __future__ import annotations

import json
import math

import pytest

from celery_aitp.core.request import HEADER_VERSION, Decision
from celery_aitp.store.decision_log import DecisionLog


def full_decision() -> Decision:
    d = Decision("split", 1_700_000_000.25, 'we"ird\\tåsk', "id-1")
    d.tenant, d.tier, d.accelerator, d.queue = "acme", "hi", "gpu", "aitp.acme.gpu.hi"
    d.routed, d.reason, d.arm = True, "routed", "routed"
    d.predicted_runtime_s, d.predicted_p90_s, d.prediction_source = 0.25, 1.5, "model"
    d.score, d.factors = 0.75, {"sla": 0.5, "age": 1.0}
    d.profile, d.tier_steps, d.origin_at = {"cpu": 2}, {"score": "hi"}, 1_699_999_999.0
    return d


def test_the_fast_encoding_decodes_to_the_record():
    for d in (full_decision(), Decision("coexistence", 1.0)):
        assert json.loads(d.record_json()) == d.record()


def test_non_finite_numbers_become_null_and_the_json_stays_valid():
    d = full_decision()
    d.predicted_runtime_s = math.inf
    assert json.loads(d.record_json())["predicted_runtime_s"] is None


def test_the_decision_log_stamps_the_policy_on_fast_encoded_records(store):
    log = DecisionLog(store, 1000, policy_digest="abc123")
    log.append([full_decision(), {"task_id": "id-2", "task": "t"}])
    found = log.find("id-1")
    assert found is not None and found["policy"] == "abc123"
    assert found == {**full_decision().record(), "policy": "abc123"}
    assert log.find("id-2")["policy"] == "abc123"


def test_shared_details_and_the_usual_factors_encode_like_the_record():
    steps = {"score": "hi", "floor": None, "cap": "mid", "fair_share": True}
    decisions = []
    for i, age in enumerate((0.0, 0.125, math.nan)):
        d = full_decision()
        d.tier_steps, d.profile = steps, {"accelerator": "gpu", "memory_mb": 512}
        d.factors = {"tenant": 0.5, "sla": 1.0, "impact": 0.0, "resources": 0.25,
                     "runtime": 1 / 3, "age": age}
        if i == 1:
            d.factors["impact"] = 1  # an int weight takes the general encoder
        decisions.append(d)
    for d in decisions[:2]:
        assert json.loads(d.record_json()) == d.record()
    decoded = json.loads(decisions[2].record_json())  # NaN as the general encoder writes it
    assert math.isnan(decoded["factors"]["age"]) and decoded["tier_steps"] == steps


@pytest.mark.parametrize("p50", [None, 0.25])
@pytest.mark.parametrize("score", [None, 0.75])
@pytest.mark.parametrize("arm", [None, "routed"])
@pytest.mark.parametrize("origin", [None, 1_700_000_000.25, 1_699_999_999.0])
def test_the_header_holds_each_field_that_is_set(p50, score, arm, origin):
    """Whatever is unset, the header holds exactly the documented fields."""
    d = full_decision()
    d.predicted_runtime_s, d.score, d.arm, d.origin_at = p50, score, arm, origin
    expected = {"v": HEADER_VERSION, "tenant": "acme", "tier": "hi", "accelerator": "gpu",
                "predicted_runtime_s": p50, "stage": "split", "routed": True,
                "queue": "aitp.acme.gpu.hi", "reason": "routed", "decided_at": d.decided_at}
    if p50 is not None:
        expected.update(predicted_p90_s=1.5, prediction_source="model")
    if arm is not None:
        expected["arm"] = arm
    if score is not None:
        expected["score"] = score
    if origin is not None and origin != d.decided_at:
        expected["origin_at"] = origin
    assert json.loads(d.header()) == expected

