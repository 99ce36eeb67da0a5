"""Fairness index, priority entropy and the small statistics behind the pages."""

from __future__ import annotations

import math

import pytest

from celery_aitp.dashboard import fairness
from celery_aitp.dashboard.stats import percentile, prediction_errors, summary


def test_jain_index_is_one_when_every_tenant_gets_its_weighted_share():
    fair = fairness.fair_shares({"a": 2, "b": 1, "c": 1}, ["a", "b", "c"])
    assert fair == {"a": 0.5, "b": 0.25, "c": 0.25}
    shares = fairness.work_shares({"a": 10.0, "b": 5.0, "c": 5.0})
    assert fairness.jain_index(shares, fair) == pytest.approx(1.0)


def test_jain_index_is_one_over_n_when_one_tenant_gets_everything():
    fair = fairness.fair_shares({}, ["a", "b", "c", "d"])  # unknown tenants weigh 1
    shares = {"a": 1.0, "b": 0.0, "c": 0.0, "d": 0.0}
    assert fairness.jain_index(shares, fair) == pytest.approx(0.25)


def test_idle_tenants_hold_no_fair_share():
    fair = fairness.fair_shares({"a": 1, "b": 3}, ["a"])
    assert fair == {"a": 1.0}
    assert fairness.jain_index({"a": 1.0}, fair) == pytest.approx(1.0)
    assert fairness.jain_index({}, {}) is None
    assert fairness.work_shares({"a": 0.0}) == {}


def test_priority_entropy_in_bits_and_normalised():
    assert fairness.priority_entropy(["hi"] * 10) == 0.0
    uniform = fairness.priority_entropy(["hi", "mid", "lo"] * 5)
    assert uniform == pytest.approx(math.log2(3))
    assert fairness.normalised_entropy(uniform, 3) == pytest.approx(1.0)
    assert fairness.priority_entropy(["hi", "lo"]) == pytest.approx(1.0)
    assert fairness.priority_entropy([]) is None and fairness.normalised_entropy(None, 3) is None


def test_percentiles_and_summary():
    assert percentile([], 50) is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([5.0], 95) == 5.0
    assert summary([3.0, 1.0, 2.0]) == {"n": 3, "p50": 2.0, "p95": pytest.approx(2.9)}


def test_prediction_errors_skip_records_without_both_figures():
    records = [
        {"task": "t", "predicted_runtime_s": 1.0, "runtime_s": 2.0},
        {"task": "t", "predicted_runtime_s": 3.0, "runtime_s": 2.0},
        {"task": "t", "predicted_runtime_s": None, "runtime_s": 2.0},  # cold start
        {"task": "u", "runtime_s": "NaN"},  # malformed, older record
    ]
    errors = prediction_errors(records)
    assert list(errors) == ["t"]
    assert errors["t"]["n"] == 2 and errors["t"]["mae_s"] == pytest.approx(1.0)
    assert errors["t"]["bias_s"] == pytest.approx(0.0) and errors["t"]["mre"] == pytest.approx(0.5)
