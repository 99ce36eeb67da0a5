"""The strict model-text reader: LightGBM's structure exactly, ModelError for anything else."""

from __future__ import annotations

import math
import random

import lightgbm
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_aitp.errors import ModelError
from celery_aitp.predict.compiled import CompiledRuntimeModel, compile_forest
from celery_aitp.predict.lgb_text import parse_model_text
from tests.unit.test_compiled import booster, data, probe


@pytest.fixture(scope="module")
def model() -> lightgbm.Booster:
    x, y = data()
    return booster(x, y, rounds=30, zero_as_missing=True)


@pytest.fixture(scope="module")
def text(model: lightgbm.Booster) -> str:
    return model.model_to_string()


def _small_text() -> str:
    x, y = data(600)
    return booster(x, y, rounds=6, zero_as_missing=True).model_to_string()


TEXT = _small_text()  # module level: hypothesis must not print a fixture value this big


def test_reading_the_text_gives_lightgbms_own_predictions(model, text):
    x, _ = data()
    forest, _, _ = compile_forest(parse_model_text(text), x.shape[1])
    rows = probe(x)
    assert [forest(list(r)) for r in rows.tolist()] == model.predict(rows, raw_score=True).tolist()


def test_categorical_splits_are_read_as_dump_model_reports_them(model, text):
    def splits(node, out):
        if "leaf_value" in node:
            return out
        if node["decision_type"] == "==":
            out.append(set(node["threshold"].split("||")))
        splits(node["left_child"], out)
        return splits(node["right_child"], out)

    ours = [splits(t["tree_structure"], []) for t in parse_model_text(text)["tree_info"]]
    theirs = [splits(t["tree_structure"], []) for t in model.dump_model()["tree_info"]]
    assert ours == theirs and any(ours)


def test_a_one_leaf_model_is_read():
    x = np.zeros((50, 2))
    one = lightgbm.train({"objective": "regression", "verbose": -1},
                         lightgbm.Dataset(x, np.ones(50), params={"verbose": -1}), 2)
    dump = parse_model_text(one.model_to_string())
    forest, _, _ = compile_forest(dump, 2)
    assert forest([0.0, 0.0]) == pytest.approx(one.predict(x[:1], raw_score=True)[0])


def test_an_infinite_threshold_splitting_missing_from_numbers_is_reproduced():
    """LightGBM writes ``inf`` for a split that sends every number left, NaN right."""
    rng = np.random.default_rng(0)
    x = np.c_[rng.integers(0, 60, 60).astype(float),
              np.where(rng.random(60) < 0.3, np.nan, rng.random(60) * 5)]
    y = np.log(x[:, 0] / 1000 + 0.01) + np.isnan(x[:, 1])
    model = lightgbm.train({"objective": "regression", "verbose": -1, "min_data_in_leaf": 3,
                            "num_leaves": 8}, lightgbm.Dataset(x, y), 10)
    text = model.model_to_string()
    assert any(line.startswith("threshold=") and "inf" in line[10:].split()
               for line in text.splitlines())

    dump = parse_model_text(text)
    forests = CompiledRuntimeModel(dump, dump, 2)
    rows = x.tolist() + [[5.0, 1e305], [5.0, math.inf], [5.0, -math.inf], [math.nan] * 2]
    theirs = model.predict(np.array(rows), raw_score=True).tolist()
    assert [forests.scores(r)[0] for r in rows] == theirs
    assert forests.key_scores is not None
    assert [forests.key_scores(forests.key(r))[0] for r in rows] == theirs


def _with_threshold(text: str, categorical: bool, value: str) -> str:
    """``text`` with the threshold of its first numeric (or categorical) split set."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("decision_type="):
            kinds = [int(v) & 1 == 1 for v in line.partition("=")[2].split()]
            if categorical in kinds:
                at = kinds.index(categorical)
                j = next(k for k in range(i, 0, -1) if lines[k].startswith("threshold="))
                values = lines[j].partition("=")[2].split()
                values[at] = value
                lines[j] = "threshold=" + " ".join(values)
                return "\n".join(lines)
    raise AssertionError("no such split")


@pytest.mark.parametrize("categorical, value, message", [
    (False, "-inf", "finite or \\+inf"), (False, "nan", "finite or \\+inf"),
    (True, "inf", "cat_boundaries"),
])
def test_only_a_numeric_split_may_have_an_infinite_threshold(text, categorical, value,
                                                             message):
    with pytest.raises(ModelError, match=message):
        parse_model_text(_with_threshold(text, categorical, value))


def test_an_infinite_leaf_value_is_refused(text):
    lines = text.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith("leaf_value="))
    lines[i] = "leaf_value=inf " + " ".join(lines[i].partition("=")[2].split()[1:])
    with pytest.raises(ModelError, match="leaf_value: values must be finite$"):
        parse_model_text("\n".join(lines))


@pytest.mark.parametrize("cut", [0, 10, 200, 0.5, 0.9])
def test_truncated_texts_are_refused(text, cut):
    end = int(len(text) * cut) if isinstance(cut, float) else cut
    with pytest.raises(ModelError):
        parse_model_text(text[:end])


@settings(max_examples=300, deadline=None, print_blob=True)
@given(seed=st.integers(0, 2**32 - 1), edits=st.integers(1, 5))
def test_mangled_texts_raise_model_error_or_parse(seed, edits):
    """Random edits of a real model never raise anything but ModelError (no crash)."""
    text = TEXT
    rng = random.Random(seed)
    lines = text.splitlines()
    trees_end = lines.index("end of trees")
    for _ in range(edits):
        i = rng.randrange(1, trees_end)
        key, _, values = lines[i].partition("=")
        parts = values.split()
        if parts:
            j = rng.randrange(len(parts))
            parts[j] = rng.choice(["-1", "999999", "x", "nan", "", "1e400", parts[j] * 2])
            if rng.random() < 0.3:
                del parts[j]
        lines[i] = key + "=" + " ".join(parts)
    try:
        dump = parse_model_text("\n".join(lines))
        compile_forest(dump, len(dump["feature_names"]))
    except ModelError:
        pass
