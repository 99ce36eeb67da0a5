"""Work shares and the small statistics behind the pages."""

from __future__ import annotations

import pytest

from celery_aitp.dashboard import shares
from celery_aitp.dashboard.stats import percentile, prediction_errors, summary


def test_fair_shares_are_weighted_among_active_tenants():
    fair = shares.fair_shares({"a": 2, "b": 1, "c": 1}, ["a", "b", "c"])
    assert fair == {"a": 0.5, "b": 0.25, "c": 0.25}
    assert shares.work_shares({"a": 10.0, "b": 5.0, "c": 5.0}) == {"a": 0.5, "b": 0.25, "c": 0.25}
    assert shares.fair_shares({}, ["a", "b"]) == {"a": 0.5, "b": 0.5}  # unknown tenants weigh 1


def test_idle_tenants_hold_no_fair_share():
    assert shares.fair_shares({"a": 1, "b": 3}, ["a"]) == {"a": 1.0}
    assert shares.work_shares({"a": 0.0}) == {}


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
