"""Hostile policy files: the loader returns a usable Policy or a PolicyError naming the field.

A policy that loads must also be one the publish path can use: every decision made with
it is a valid tier (no NaN score, no infinite SLA sneaking past validation). ``celery
aitp validate`` exits 0 or 1 with ``invalid: <path>: <reason>`` lines, never a traceback.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from celery_aitp.cli.standalone import main
from celery_aitp.core.request import Request
from celery_aitp.core.view import View
from celery_aitp.errors import PolicyError
from celery_aitp.policy import Policy, parse_policy, read_policy_file
from celery_aitp.publish.pipeline import Pipeline, default_stages
from tests.unit.hostile import HOSTILE, deep_json_text, json_values, odd_bytes, odd_floats, utf8

numbers = st.one_of(st.floats(0.001, 1000), odd_floats, json_values)
tier = st.fixed_dictionaries({"name": st.sampled_from(["hi", "mid", "lo", "Bad Name", ""])},
                             optional={"sla_s": numbers, "weight": numbers,
                                       "min_score": numbers, "extra": json_values})
tenant = st.fixed_dictionaries({}, optional={"max_tier": st.one_of(st.sampled_from(
    ["hi", "lo", "gold"]), json_values), "weight": numbers, "sla_s": numbers})
policies = st.one_of(
    st.fixed_dictionaries({}, optional={
        "tiers": st.one_of(st.lists(tier, max_size=4), json_values),
        "tenants": st.one_of(st.dictionaries(st.sampled_from(["acme", "default", "ACME!"]),
                                             tenant, max_size=3), json_values),
        "default_tenant": st.sampled_from(["default", "acme", "nobody"]),
        "labels": st.dictionaries(st.sampled_from(["vip", "bad label"]), numbers, max_size=2),
        "priority": st.fixed_dictionaries({}, optional={
            "runtime_min_s": numbers, "runtime_max_s": numbers, "max_age_s": numbers,
            "memory_scale_mb": numbers, "weights": st.dictionaries(
                st.sampled_from(["tenant", "sla", "age", "nope"]), numbers, max_size=3)}),
        "fair_share": st.fixed_dictionaries({}, optional={"default_cost_s": numbers,
                                                          "half_life_s": numbers}),
        "stage": st.one_of(st.sampled_from(["takeover", "shadow"]), json_values),
        "unknown_key": json_values}),
    json_values)


def _usable(policy: Policy) -> None:
    """Decide a few tasks with the policy: every tier is one of the policy's."""
    pipeline = Pipeline(default_stages(policy))
    view = View(frozenset(), policy.stage, policy.split, fresh=True)
    for tenant_name in policy.tenants:
        for retries in (0, 3):
            request = Request("t.x", "id", (1,), {}, {"aitp_tenant": tenant_name}, {}, None,
                              1.7e9, retries)
            decision = pipeline.decide(request, view, 1.7e9)
            assert decision.tier in policy.tier_names
            assert decision.score is not None and math.isfinite(decision.score)


@HOSTILE
@given(data=policies)
def test_a_policy_mapping_loads_or_names_what_is_wrong(data):
    try:
        policy = parse_policy(data)
    except PolicyError as exc:
        message = str(exc)
        assert message and all(": " in line for line in message.splitlines()), message
        return
    _usable(policy)


@HOSTILE
@given(data=policies, kind=st.sampled_from([".json", ".yaml"]))
def test_a_policy_file_loads_or_names_what_is_wrong(tmp_path_factory, data, kind):
    path = tmp_path_factory.mktemp("policy") / f"aitp{kind}"
    path.write_text(json.dumps(data))  # JSON is YAML too
    try:
        policy = read_policy_file(path)
    except PolicyError as exc:
        assert str(exc)
        return
    _usable(policy)


@HOSTILE
@given(content=st.one_of(odd_bytes, st.text().map(utf8), st.sampled_from(
    [b"tiers: [", b"{", b"- a\n- b", b"\xff\xfe\x00t\x00i", b"tiers: !!python/object:os.system x",
     b"a: &x [*x]", utf8(deep_json_text(3_000)), b"[" * 3_000])),
       kind=st.sampled_from([".json", ".yaml", ".yml"]))
def test_garbage_policy_files_raise_policy_error_naming_the_file(tmp_path_factory, content,
                                                                  kind):
    path = tmp_path_factory.mktemp("garbage") / f"aitp{kind}"
    path.write_bytes(content)
    try:
        read_policy_file(path)
    except PolicyError as exc:  # the file (unreadable, not JSON/YAML) or the field, by path
        message = str(exc)
        assert str(path) in message or all(": " in line for line in message.splitlines())


@pytest.mark.parametrize("field,value", [
    ("tiers", [{"name": "hi", "sla_s": math.inf}, {"name": "lo", "sla_s": 10}]),
    ("tiers", [{"name": "hi", "sla_s": math.nan}]),
    ("priority", {"runtime_max_s": math.inf}),
    ("fair_share", {"default_cost_s": math.inf}),
    ("tenants", {"default": {"sla_s": math.inf}}),
])
def test_infinite_or_nan_numbers_are_refused_by_path(field, value):
    with pytest.raises(PolicyError, match=field):
        parse_policy({field: value})


@pytest.mark.parametrize("content", [b"\xff\xfe garbage", utf8(deep_json_text(100_000))])
def test_validate_reports_bad_files_without_a_traceback(tmp_path: Path, content: bytes):
    path = tmp_path / "aitp.json"
    path.write_bytes(content)
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 1, result.output
    assert "invalid:" in result.output and str(path) in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
