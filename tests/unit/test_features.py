"""Publish-time features: deterministic, never raising, the same at training and publish."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from enum import IntEnum
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_aitp.predict.features import (
    BASE_FEATURES,
    BIG,
    HISTORY_FEATURES,
    FeatureSpec,
    argument_features,
    base_of,
    call_signature,
    history_features,
    hour_and_weekday,
    magnitude_class,
    value_of,
)


class Level(IntEnum):
    HIGH = 3


class Hostile:
    """An argument whose every hook raises: features must not call or must survive it."""

    def __len__(self) -> int:
        raise RuntimeError("no len")

    def __float__(self) -> float:
        raise RuntimeError("no float")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class HostileList(list):  # type: ignore[type-arg]
    def __len__(self) -> int:
        raise RuntimeError("no len")


def same(a: Any, b: Any) -> bool:
    return (a != a and b != b) or a == b


def test_values_are_numbers_lengths_or_missing():
    assert value_of(3) == 3 and value_of(2.5) == 2.5 and value_of(True) == 1
    assert value_of("abcd") == 4 and value_of(b"ab") == 2 and value_of([1, 2, 3]) == 3
    assert value_of({"a": 1}) == 1 and value_of({1, 2}) == 2
    assert math.isnan(value_of(None)) and math.isnan(value_of(float("nan")))
    assert value_of(float("inf")) == BIG and value_of(-(10**400)) == -BIG
    assert value_of(np.float32(1.5)) == 1.5 and value_of(np.int64(7)) == 7.0
    assert value_of(np.zeros((3, 4))) == 12 and value_of(Level.HIGH) == 3.0
    assert math.isnan(value_of(Decimal("1.5"))) and math.isnan(value_of(object()))


def test_hostile_objects_never_reach_the_caller():
    assert math.isnan(value_of(Hostile()))
    assert math.isnan(value_of(HostileList([1])))
    features = argument_features([Hostile(), HostileList()], {"x": Hostile()})
    assert features["n_args"] == 2 and math.isnan(features["arg0"])


def test_huge_arguments_cost_no_more_than_small_ones():
    huge = list(range(1_000_000))
    features = argument_features([huge, "x" * 10**7], {"blob": b"\0" * 10**7})
    assert features["arg0"] == 1_000_000 and features["arg1"] == 10**7
    assert features["kw.blob"] == 10**7


def test_utc_hour_and_weekday():
    assert hour_and_weekday(0) == (0, 3)  # 1970-01-01 00:00 UTC, a Thursday
    assert hour_and_weekday(1_700_000_000.5) == (22, 1)  # 2023-11-14 22:13 UTC, a Tuesday
    assert all(math.isnan(v) for v in hour_and_weekday(float("nan")))
    assert all(math.isnan(v) for v in hour_and_weekday("yesterday"))


def test_history_features_use_the_newest_runs():
    found = dict(zip(HISTORY_FEATURES, history_features([3.0, 1.0, 100.0], 57, [8.0, 2.0]),
                     strict=True))
    assert found["h_last2"] == 2.0 and found["h_mean"] == 104.0 / 3 and found["h_count"] == 57
    assert found["h_last"] == 3.0 and found["h_prev"] == 1.0 and found["h_median"] == 3.0
    assert found["h_spread"] == pytest.approx(math.log(3.0))
    assert found["t_last2"] == 5.0  # the tenant's runs of any task
    assert found["base_s"] == 2.0  # the pair's own last two come first
    # the usual runtime against the last two (2.0), and the last run against the one before
    assert found["h_median_r"] == 1.5 and found["h_mean_r"] == pytest.approx(52.0 / 3)
    assert found["h_trend"] == pytest.approx(math.log(3.0))
    falling = dict(zip(HISTORY_FEATURES, history_features([1.0, 4.0], 2), strict=True))
    assert falling["h_trend"] == pytest.approx(-math.log(4.0))
    assert falling["h_spread"] == pytest.approx(math.log(4.0))
    zero = dict(zip(HISTORY_FEATURES, history_features([0.0, 0.0], 2), strict=True))
    assert zero["h_median_r"] == 1.0 and zero["h_trend"] == 0.0  # no division by zero
    assert history_features([5.0], 10_000)[2] == 100  # the count is capped
    assert math.isnan(history_features([5.0], 1)[HISTORY_FEATURES.index("h_spread")])
    assert math.isnan(history_features([5.0], 1)[HISTORY_FEATURES.index("h_trend")])
    assert all(math.isnan(v) for v in history_features([], 0, [3.0])[
        HISTORY_FEATURES.index("h_median_r"):HISTORY_FEATURES.index("t_last2")])
    empty = history_features([], 0)
    assert math.isnan(empty[0]) and math.isnan(empty[1]) and empty[2] == 0


def test_base_falls_back_from_pair_to_tenant_to_default():
    assert base_of(history_features([4.0, 2.0], 2, [9.0]), 7.0) == 3.0
    assert base_of(history_features([], 0, [9.0, 1.0]), 7.0) == 5.0
    assert base_of(None, 7.0) == 7.0
    assert base_of(history_features([0.0, 0.0], 2), 7.0) == 7.0  # never a zero base


def test_a_calls_signature_follows_its_values_not_their_order_or_repr_sizes():
    def signed(*args: Any, bytes_: int = 10, **kwargs: Any) -> str:
        return call_signature(argument_features(args, kwargs, bytes_, bytes_))

    report = signed(42, rows=1000, fast=True)
    assert report == call_signature(argument_features((42,), {"fast": True, "rows": 1000}))
    assert signed(42, rows=1000, fast=True, bytes_=99) == report  # repr sizes left out
    assert signed(42.0, rows=1000, fast=1) == report  # the values as the features read them
    assert signed(43, rows=1000, fast=True) != report
    assert signed(42, rows=1001, fast=True) != report
    assert signed(42, 1000, fast=True) != report  # positional, not keyword
    assert signed("acme") == signed("ACME") != signed("acme-1")  # a string by its length
    assert signed(None) == signed(object()) == signed(math.nan)  # missing values alike
    assert len(report) == 16 and int(report, 16) >= 0  # short hex: a store field's name
    assert len(call_signature({1: 2.0, "a": [], None: 3})) == 16  # never raises


def test_the_vector_follows_the_spec_names():
    spec = FeatureSpec(["rows"], ["report"], ["acme"])
    vec = spec.vector("report", "acme", (640, [1, 2]), {"rows": 9}, 12, 13, 2.5, 1,
                      1_700_000_000.0, history_features([0.4, 0.6, 1.1], 4))
    named = dict(zip(spec.names, vec, strict=True))
    assert spec.names[: len(BASE_FEATURES)] == BASE_FEATURES and spec.names[-1] == "kw.rows"
    assert named["task"] == 0 and named["tenant"] == 0 and named["arg0"] == 640
    assert named["arg1"] == 2 and math.isnan(named["arg2"]) and named["kw.rows"] == 9
    assert named["args_bytes"] == 12 and named["hint_s"] == 2.5 and named["h_last2"] == 0.5
    assert named["h_last"] == 0.4 and named["h_median"] == 0.6 and named["base_s"] == 0.5
    unknown = spec.vector("other", "globex", None, None, None, None, None, None, None, None)
    assert all(math.isnan(v) for v in unknown[:2]) and unknown[2] == 0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=5),
    max_leaves=20,
)
odd_values = json_values | st.builds(Hostile) | st.builds(object) | st.binary(max_size=20) | \
    st.decimals(allow_nan=True) | st.builds(lambda: np.arange(5))


@settings(max_examples=150, deadline=None)
@given(args=st.lists(odd_values, max_size=6), kwargs=st.dictionaries(st.text(max_size=8),
                                                                       odd_values, max_size=6),
       published=st.floats(allow_nan=True) | st.integers() | st.none())
def test_arbitrary_arguments_never_raise(args: list[Any], kwargs: dict[str, Any],
                                         published: Any) -> None:
    spec = FeatureSpec(sorted(kwargs)[:3], ["t"], ["a"])
    vec = spec.vector("t", "a", tuple(args), kwargs, 10, None, None, 0, published, None)
    assert len(vec) == len(spec.names)
    assert all(isinstance(v, (int, float)) for v in vec)
    assert spec.vector("t", "a", tuple(args), kwargs, 10, None, None, 0, published, None) == \
        vec or any(v != v for v in vec)  # deterministic (NaN != NaN aside)


@settings(max_examples=150, deadline=None)
@given(args=st.lists(json_values, max_size=6),
       kwargs=st.dictionaries(st.text(max_size=8), json_values, max_size=6))
def test_training_rows_equal_publish_vectors(args: list[Any], kwargs: dict[str, Any]) -> None:
    """A worker records argument features as JSON; the trainer's row from them must equal
    the vector the publish path computes from the real arguments."""
    spec = FeatureSpec(sorted(kwargs)[:4], ["t"], ["a"])
    recorded = argument_features(args, kwargs, 17, 23)
    as_json = json.loads(json.dumps({k: (None if v != v else v) for k, v in recorded.items()}))
    row = spec.row("t", "a", as_json, None, 0, 1_700_000_000.0, (1.0, 2.0, 3))
    vec = spec.vector("t", "a", tuple(args), kwargs, 17, 23, None, 0, 1_700_000_000.0,
                      (1.0, 2.0, 3))
    assert all(same(float(v), r) for v, r in zip(vec, row, strict=True)), (vec, row)


def test_a_calls_magnitude_is_the_doubling_of_its_largest_argument():
    assert magnitude_class([10], {}) == 4 and magnitude_class([50], {}) == 6
    assert magnitude_class([500, 3], {"quality": 60}) == 9  # the largest value decides
    assert magnitude_class([], {"rows": -1500}) == 11  # its size, whatever the sign
    assert magnitude_class(["x" * 100], {}) == 7  # a string's length
    assert magnitude_class([0.25], {}) == 0
    assert magnitude_class([], {}) is None and magnitude_class([None, math.nan], {}) is None
    assert magnitude_class([1e300], {}) == 40  # capped
    assert magnitude_class("not a list", 7) is None
    # the same for the arguments a worker sees again in its observation record
    args, kwargs = [494, 2178], {"quality": 60}
    assert magnitude_class(json.loads(json.dumps(args)),
                           json.loads(json.dumps(kwargs))) == magnitude_class(args, kwargs)


@settings(max_examples=100, deadline=None)
@given(args=st.lists(json_values, max_size=6),
       kwargs=st.dictionaries(st.text(max_size=8), json_values, max_size=6))
def test_a_worker_signs_the_call_a_producer_signed(args: list[Any], kwargs: dict[str, Any]
                                                   ) -> None:
    """The producer signs the real arguments; the worker signs the argument features it
    recorded as JSON: the same call must get the same signature."""
    recorded = argument_features(args, kwargs, 17, 23)
    as_json = json.loads(json.dumps({k: (None if v != v else v) for k, v in recorded.items()}))
    assert call_signature(as_json) == call_signature(argument_features(args, kwargs))
