"""Compiled forests reproduce LightGBM exactly; the split-keyed cache never changes an answer."""

from __future__ import annotations

import math

import lightgbm
import numpy as np
import pytest

from celery_aitp.errors import ModelError
from celery_aitp.predict.compiled import CompiledRuntimeModel, compile_forest, on_grid


def data(n: int = 3000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Numeric, categorical, zero-heavy and missing values, with a non-linear target."""
    rng = np.random.default_rng(seed)
    x = np.column_stack([
        rng.integers(0, 8, n).astype(float),  # categorical code
        rng.normal(size=n),
        np.where(rng.random(n) < 0.3, 0.0, rng.exponential(5, n)),  # many zeros
        rng.integers(0, 100, n).astype(float),
    ])
    x[rng.random(n) < 0.15, 1] = np.nan
    x[rng.random(n) < 0.1, 0] = np.nan
    y = np.sin(x[:, 1] * 2) * (x[:, 0] % 3) + np.log1p(x[:, 2]) + (x[:, 3] > 50)
    return x, np.nan_to_num(y)


def booster(x: np.ndarray, y: np.ndarray, rounds: int = 40, **params: object
            ) -> lightgbm.Booster:
    base = {"objective": "regression", "num_leaves": 15, "verbose": -1, "min_data_per_group": 5,
            "cat_smooth": 1, "seed": 1}
    dataset = lightgbm.Dataset(x, y, categorical_feature=[0], params={"verbose": -1})
    return lightgbm.train({**base, **params}, dataset, rounds)


def probe(x: np.ndarray, seed: int = 1) -> np.ndarray:
    """Rows mixing training values, exact zeros, NaN, negatives and unseen categories."""
    rng = np.random.default_rng(seed)
    rows = x[rng.integers(0, len(x), 800)].copy()
    rows[:50, 2] = 0.0
    rows[50:100, 1] = np.nan
    rows[100:150, 0] = -1.0
    rows[150:200, 0] = 42.0
    rows[200:250, 3] = np.nan
    return rows


@pytest.mark.parametrize("params", [{}, {"zero_as_missing": True}, {"use_missing": False},
                                    {"objective": "quantile", "alpha": 0.9}])
def test_compiled_forest_equals_lightgbm_predict(params):
    x, y = data()
    model = booster(x, y, **params)
    forest, _usage, source = compile_forest(model.dump_model(), x.shape[1])
    rows = probe(x)
    expected = model.predict(rows, raw_score=True)
    got = [forest(list(row)) for row in rows.tolist()]
    assert got == expected.tolist()  # the same doubles, summed in the same order
    assert "lightgbm" not in source.lower()


def test_cached_answers_equal_direct_evaluation_and_hits_happen():
    x, y = data()
    low, high = booster(x, y), booster(x, y - 1.0, rounds=10)
    model = CompiledRuntimeModel(low.dump_model(), high.dump_model(), x.shape[1])
    rows = probe(x).tolist()
    hits = 0
    for row in rows + rows:
        p50, p90, hit = model.predict(row)
        hits += hit
        want = tuple(on_grid(v) for v in model.evaluate(row))
        assert (p50, p90) == want  # a hit returns what evaluation gives, on the grid
        assert p90 >= p50
    assert hits >= len(rows)  # the second pass is all hits
    low_score = low.predict(np.array(rows[:20]), raw_score=True)
    assert [model.raw(r)[0] for r in rows[:20]] == pytest.approx(low_score.tolist(), rel=1e-12)
    assert model.evaluate(rows[0])[0] == pytest.approx(math.exp(low_score[0]))


def test_rows_that_differ_only_between_thresholds_share_a_key():
    x, y = data()
    model = CompiledRuntimeModel(booster(x, y).dump_model(), booster(x, y, 5).dump_model(), 4)
    row = [1.0, 0.3, 2.0, 10.0]
    j = 3
    thresholds = model.thresholds[j]
    inside = [t for t in thresholds if t > 10.0][0]
    neighbour = list(row)
    neighbour[j] = math.nextafter(inside, -math.inf)  # still on the same side of every split
    assert model.key(row) == model.key(neighbour)
    beyond = list(row)
    beyond[j] = math.nextafter(inside, math.inf)
    assert model.key(row) != model.key(beyond)


def test_the_cache_is_bounded():
    x, y = data()
    model = CompiledRuntimeModel(booster(x, y).dump_model(), booster(x, y, 5).dump_model(), 4,
                                 cache_size=50)
    for row in probe(x).tolist():
        model.predict(row)
    assert len(model.cache) <= 50


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(num_class=3), "single-output"),
    (lambda d: d.update(average_output=True), "averaged"),
    (lambda d: d.update(tree_info=[]), "no trees"),
    (lambda d: d["tree_info"][0]["tree_structure"].update(decision_type="<"), "decision type"),
    (lambda d: d["tree_info"][0]["tree_structure"].update(threshold="nan"), "not finite"),
    (lambda d: d["tree_info"][0]["tree_structure"].update(threshold="-inf"), "not finite"),
    (lambda d: d["tree_info"][0]["tree_structure"].update(split_feature=99), "features"),
    (lambda d: d["tree_info"][0].update(is_linear=True), "linear"),
])
def test_what_cannot_be_reproduced_is_refused(change, message):
    x, y = data(500)
    dump = lightgbm.train({"objective": "regression", "verbose": -1, "num_leaves": 4},
                          lightgbm.Dataset(x[:, 1:], y, params={"verbose": -1}), 3).dump_model()
    change(dump)
    with pytest.raises(ModelError, match=message):
        compile_forest(dump, 3)


@pytest.mark.parametrize("params", [{}, {"zero_as_missing": True}, {"use_missing": False}])
def test_forests_over_the_cache_key_give_the_same_doubles(params):
    x, y = data()
    x[::7, 2] = -1e-36  # inside LightGBM's zero band
    model = CompiledRuntimeModel(booster(x, y, **params).dump_model(),
                                 booster(x, y - 1.0, rounds=10, **params).dump_model(), 4)
    assert model.key_scores is not None
    rows = probe(x).tolist() + [[math.nan] * 4, [0.0] * 4, [-0.0, -1e-35, 1e-35, -5.0]]
    for row in rows:
        assert model.key_scores(model.key(row)) == model.scores(row)
    model.cache.clear()
    assert [model.predict(r)[:2] for r in rows] == [
        tuple(on_grid(v) for v in model.evaluate(r)) for r in rows]


#: LightGBM's zero band edge: ``kZeroThreshold = 1e-35f``, a float widened to a double.
FLOAT_ZERO_EDGE = float(np.float32(1e-35))


def _zero_split_dump(default_left: bool) -> dict:
    """One tree, one split of feature 0 at -1.0 whose missing values are zeros."""
    return {"tree_info": [{"tree_structure": {
        "split_feature": 0, "threshold": -1.0, "decision_type": "<=",
        "missing_type": "Zero", "default_left": default_left,
        "left_child": {"leaf_value": 1.0}, "right_child": {"leaf_value": 2.0}}}]}


@pytest.mark.parametrize("value", [-FLOAT_ZERO_EDGE, FLOAT_ZERO_EDGE, -1e-35, 0.0])
def test_values_up_to_the_float_zero_threshold_count_as_zero(value):
    # LightGBM's IsZero is |v| <= 1e-35f: each of these takes the default (left) branch,
    # though -1.0000000180025095e-35 is beyond the double -1e-35.
    assert FLOAT_ZERO_EDGE > 1e-35
    forest, _usage, _source = compile_forest(_zero_split_dump(default_left=True), 1)
    assert forest([value]) == 1.0
    model = CompiledRuntimeModel(_zero_split_dump(True), _zero_split_dump(True), 1)
    assert model.key_scores is not None
    assert model.key_scores(model.key([value])) == model.scores([value]) == (1.0, 1.0)


def test_just_beyond_the_float_zero_threshold_is_a_number():
    forest, _usage, _source = compile_forest(_zero_split_dump(default_left=True), 1)
    assert forest([math.nextafter(-FLOAT_ZERO_EDGE, -math.inf)]) == 2.0  # > -1.0: right
    assert forest([math.nextafter(FLOAT_ZERO_EDGE, math.inf)]) == 2.0


def test_the_zero_band_edge_agrees_with_lightgbm():
    # a feature whose zeros are missing: LightGBM's own predictions at the band's edge
    rng = np.random.default_rng(3)
    n = 2000
    x = np.column_stack([np.where(rng.random(n) < 0.4, 0.0, rng.normal(0, 3, n)),
                         rng.normal(size=n)])
    y = np.where(x[:, 0] == 0.0, 5.0, x[:, 0]) + x[:, 1]
    model = lightgbm.train({"objective": "regression", "num_leaves": 7, "verbose": -1,
                            "zero_as_missing": True, "seed": 1},
                           lightgbm.Dataset(x, y, params={"verbose": -1}), 20)
    forest, _usage, _source = compile_forest(model.dump_model(), 2)
    edges = [-FLOAT_ZERO_EDGE, FLOAT_ZERO_EDGE, -1e-35, 1e-35,
             math.nextafter(-FLOAT_ZERO_EDGE, -math.inf), math.nextafter(FLOAT_ZERO_EDGE, 1.0)]
    rows = [[e, b] for e in edges for b in (-1.0, 0.5)]
    assert [forest(r) for r in rows] == model.predict(np.array(rows), raw_score=True).tolist()


def _thresholds(node: dict) -> set[float]:
    if "leaf_value" in node:
        return set()
    own = {node["threshold"]} if node.get("decision_type") == "<=" else set()
    return own | _thresholds(node["left_child"]) | _thresholds(node["right_child"])


@pytest.mark.parametrize("params", [{}, {"use_missing": False}])
def test_values_in_the_zero_band_go_where_zero_goes_as_in_lightgbm(params):
    # LightGBM's predictor reads |v| <= 1e-35f as 0.0 and puts bin bounds at -1e-35f,
    # so a value exactly there must not go left of a split at it
    rng = np.random.default_rng(5)
    n = 3000
    x = np.column_stack([np.where(rng.random(n) < 0.4, 0.0, rng.normal(0, 3, n)),
                         rng.normal(size=n)])
    y = np.where(x[:, 0] == 0.0, 5.0, np.where(x[:, 0] < 0, -3.0, x[:, 0])) + x[:, 1]
    model = lightgbm.train({"objective": "regression", "num_leaves": 7, "verbose": -1,
                            "seed": 1, **params},
                           lightgbm.Dataset(x, y, params={"verbose": -1}), 20)
    dump = model.dump_model()
    split_at = set().union(*(_thresholds(t["tree_structure"]) for t in dump["tree_info"]))
    assert split_at & {-FLOAT_ZERO_EDGE, FLOAT_ZERO_EDGE}  # the case this test is about
    forest, _usage, _source = compile_forest(dump, 2)
    band = [-FLOAT_ZERO_EDGE, FLOAT_ZERO_EDGE, -1e-36, 1e-36, 0.0, -0.0,
            math.nextafter(-FLOAT_ZERO_EDGE, -math.inf), math.nextafter(FLOAT_ZERO_EDGE, 1.0)]
    rows = [[v, b] for v in band for b in (-1.0, 0.5)]
    assert [forest(r) for r in rows] == model.predict(np.array(rows), raw_score=True).tolist()
    compiled = CompiledRuntimeModel(dump, dump, 2)
    assert compiled.key_scores is not None
    for r in rows:
        assert compiled.key_scores(compiled.key(r)) == compiled.scores(r)
