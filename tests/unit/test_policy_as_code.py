"""Priority, fair-share and profile policy sections; the digest and the change history."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from celery_aitp.cli.celery_command import aitp
from celery_aitp.errors import PolicyError
from celery_aitp.policy import Policy, parse_policy
from celery_aitp.policy_history import PolicyRecorder, policy_digest, policy_history
from celery_aitp.priority_policy import TierOrder
from tests.conftest import TEST_POLICY


def test_defaults_give_even_tier_scores_and_8x_read_weights():
    policy = Policy()
    assert policy.tier_min_scores() == pytest.approx((2 / 3, 1 / 3, 0.0))
    assert policy.tier_weights() == {"hi": 64, "mid": 8, "lo": 1}
    assert policy.tier_order is TierOrder.WEIGHTED
    assert policy.priority.weights.sla == 4 and policy.fair_share.half_life_s == 900


def test_bad_priority_fields_are_reported_by_path():
    with pytest.raises(PolicyError) as info:
        parse_policy({
            "priority": {"weights": {"tenant": -1}, "runtime_min_s": 0},
            "fair_share": {"half_life_s": 0},
            "profiles": {"target_percentile": 1.5, "floors": {"memory_mb": -1}},
            "tier_order": "random",
        })
    text = str(info.value)
    for path in ("priority.weights.tenant", "priority.runtime_min_s", "fair_share.half_life_s",
                 "profiles.target_percentile", "profiles.floors.memory_mb", "tier_order"):
        assert path in text


def test_cross_field_rules_of_the_new_sections():
    with pytest.raises(PolicyError, match="at least one priority weight"):
        parse_policy({"priority": {"weights": dict.fromkeys(
            ("tenant", "sla", "impact", "resources", "runtime", "age"), 0)}})
    with pytest.raises(PolicyError, match="runtime_max_s must be greater"):
        parse_policy({"priority": {"runtime_min_s": 10, "runtime_max_s": 5}})
    with pytest.raises(PolicyError, match=r"tiers\.1\.min_score: 0\.8 must be below"):
        parse_policy({"tiers": [{"name": "hi", "sla_s": 1, "min_score": 0.5},
                                {"name": "mid", "sla_s": 2, "min_score": 0.8},
                                {"name": "lo", "sla_s": 3}]})
    with pytest.raises(PolicyError, match=r"weight 2\.0 is not in"):
        parse_policy({"labels": {"vip": 2}})
    with pytest.raises(PolicyError, match="not a valid label name"):
        parse_policy({"labels": {"no spaces": 1}})


def test_the_digest_is_stable_and_changes_with_any_field():
    assert policy_digest(Policy()) == policy_digest(parse_policy({}))
    assert policy_digest(Policy()) != policy_digest(
        parse_policy({"priority": {"weights": {"age": 2}}}))


def test_each_change_of_the_active_policy_is_recorded_once(store):
    first = PolicyRecorder(Policy(), "file aitp.yaml")
    first(store)
    PolicyRecorder(Policy(), "another process")(store)  # same policy: nothing added
    changed = PolicyRecorder(parse_policy({"fair_share": {"half_life_s": 60}}), "install()")
    changed(store)
    changed(store)  # once per process
    history = policy_history(store)
    assert [h["source"] for h in history] == ["install()", "file aitp.yaml"]
    assert history[0]["digest"] == changed.digest
    assert history[0]["policy"]["fair_share"]["half_life_s"] == 60
    assert {"at", "host", "pid"} <= set(history[0])


def test_the_app_records_its_policy_with_its_source_and_decisions_carry_the_digest(app, store):
    from tests.unit.conftest import make_live

    make_live(store, "aitp.default.cpu.lo")
    app.tasks["tests.unit.conftest.plain"].delay(1)
    app.aitp.live.flush()
    history = policy_history(store)
    assert history[0]["digest"] == app.aitp.policy_digest
    assert history[0]["source"] == "install() mapping"
    record = store.read_records(store.keys.decisions)[-1]
    assert record["policy"] == app.aitp.policy_digest


def test_policy_command_shows_digest_and_history(app, store):
    app.aitp.policy_recorder(store)
    runner = CliRunner()
    result = runner.invoke(aitp, ["policy", "--json"], obj=type("Ctx", (), {"app": app})())
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["digest"] == app.aitp.policy_digest and len(data["history"]) == 1
    plain = runner.invoke(aitp, ["policy"], obj=type("Ctx", (), {"app": app})())
    assert app.aitp.policy_digest in plain.output


def test_test_policy_still_valid():
    assert parse_policy(TEST_POLICY).tier_names == ("hi", "mid", "lo")
