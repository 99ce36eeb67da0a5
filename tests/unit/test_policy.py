"""Policy validation: every bad field named by its path; good files load."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from celery_aitp.cli.standalone import main
from celery_aitp.errors import PolicyError
from celery_aitp.policy import Policy, Stage, load_policy, parse_policy, read_policy_file


def test_defaults_are_valid_and_ordered_highest_first():
    policy = Policy()
    assert policy.tier_names == ("hi", "mid", "lo")
    assert policy.lowest_tier() == "lo"
    assert policy.stage is Stage.COEXISTENCE


def test_tenant_cap_limits_allowed_tiers():
    policy = parse_policy({"tenants": {"default": {}, "acme": {"max_tier": "mid"}}})
    assert policy.allowed_tiers("acme") == ("mid", "lo")
    assert policy.allowed_tiers("default") == ("hi", "mid", "lo")


def test_every_invalid_field_is_reported_by_path():
    with pytest.raises(PolicyError) as info:
        parse_policy({
            "tiers": [{"name": "hi", "sla_s": -1}, {"name": "Bad Name", "sla_s": 1}],
            "tenants": {"default": {"weight": 0}},
        })
    text = str(info.value)
    assert "tiers.0.sla_s" in text
    assert "tiers.1.name" in text
    assert "tenants.default.weight" in text


def test_cross_references_are_checked():
    with pytest.raises(PolicyError) as info:
        parse_policy({"tenants": {"acme": {"max_tier": "gold"}}, "default_tenant": "nobody",
                      "default_accelerator": "tpu", "split": {"tiers": ["x"]}})
    text = str(info.value)
    assert "tenants.acme.max_tier: unknown tier 'gold'" in text
    assert "default_tenant" in text and "default_accelerator" in text and "split.tiers" in text


def test_unknown_keys_are_rejected():
    with pytest.raises(PolicyError, match="tierz"):
        parse_policy({"tierz": []})


def test_non_mapping_is_rejected():
    with pytest.raises(PolicyError, match="expected a mapping"):
        parse_policy(["not", "a", "mapping"])  # type: ignore[arg-type]


def test_yaml_and_json_files_load(tmp_path):
    yml = tmp_path / "p.yaml"
    yml.write_text("tenants:\n  default: {}\n  acme: {max_tier: hi, weight: 3}\nstage: split\n")
    js = tmp_path / "p.json"
    js.write_text(json.dumps({"stage": "takeover"}))
    assert read_policy_file(yml).tenants["acme"].weight == 3
    assert load_policy(str(js)).stage is Stage.TAKEOVER


def test_unreadable_and_malformed_files_are_clear_errors(tmp_path):
    with pytest.raises(PolicyError, match="cannot read"):
        read_policy_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(PolicyError, match="not valid JSON"):
        read_policy_file(bad)


def test_a_key_named_twice_is_refused_not_last_one_wins(tmp_path):
    """``acme`` capped at lo, then listed again with hi further down, validated as hi."""
    yml = tmp_path / "twice.yaml"
    yml.write_text("tenants:\n  default: {}\n  acme: {max_tier: lo}\n  acme: {max_tier: hi}\n")
    with pytest.raises(PolicyError, match="duplicate key 'acme'"):
        read_policy_file(yml)
    js = tmp_path / "twice.json"
    js.write_text('{"stage": "split", "stage": "takeover"}')
    with pytest.raises(PolicyError, match="duplicate key 'stage'"):
        read_policy_file(js)


@pytest.mark.parametrize("value", [True, "3"])
def test_a_number_field_takes_no_boolean_or_string(value):
    with pytest.raises(PolicyError, match="weight: .* is not a number"):
        parse_policy({"tenants": {"default": {}, "acme": {"weight": value}}})
    with pytest.raises(PolicyError, match="tenant: .* is not a number"):
        parse_policy({"priority": {"weights": {"tenant": value}}})


def test_split_selectors_are_bounded():
    """Every producer matches each task against them: 50,000 task globs made a publish
    take 12 ms."""
    with pytest.raises(PolicyError, match="split.tasks: .*at most 1000"):
        parse_policy({"split": {"tasks": [f"t{i}.*" for i in range(1001)]}})
    assert len(parse_policy({"split": {"tasks": ["t.*"] * 1000}}).split.tasks) == 1000


def test_validate_command_lists_errors_and_exits_non_zero(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("tiers: [{name: hi, sla_s: 0}]\ntenants: {default: {max_tier: nope}}\n")
    result = CliRunner().invoke(main, ["validate", str(bad)])
    assert result.exit_code == 1
    assert "tiers.0.sla_s" in result.output


def test_validate_command_accepts_a_good_file(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("stage: takeover\n")
    result = CliRunner().invoke(main, ["validate", str(good)])
    assert result.exit_code == 0, result.output
    assert "valid" in result.output


def test_a_list_whose_items_failed_is_not_also_called_too_short():
    with pytest.raises(PolicyError) as found:
        parse_policy({"tiers": [{"name": "hi", "sla_s": -5}]})
    assert str(found.value) == "tiers.0.sla_s: Input should be greater than 0"
    with pytest.raises(PolicyError, match="tiers: Tuple should have at least 1 item"):
        parse_policy({"tiers": []})  # an empty list is still said to be one
