"""Hostile model files and task arguments: ModelError naming the problem, or a usable model;
features of any argument values, never an exception.

Model texts are any text, a real model with mangled metadata, or files that are not UTF-8;
arguments are anything Python can pass (objects whose every conversion raises included).
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_aitp.errors import ModelError
from celery_aitp.predict.bundle import ModelBundle, load_bundle
from celery_aitp.predict.features import FeatureSpec, argument_features
from celery_aitp.predict.lgb_text import parse_model_text
from tests.unit.hostile import HOSTILE, deep_json_text, json_values, odd_bytes, odd_text, py_values


@pytest.fixture(scope="module")
def bundle(trained: Any) -> ModelBundle:
    assert trained.bundle is not None
    return trained.bundle


@HOSTILE
@given(text=st.one_of(odd_text, st.text().map(lambda t: "tree\n" + t),
                      st.text().map(lambda t: "tree\n" + t + "\nend of trees")))
def test_any_text_is_a_model_or_a_model_error(text):
    try:
        parse_model_text(text)
    except ModelError as exc:
        assert str(exc)


META_KEYS = ["format", "schema", "feature_names", "kwarg_names", "tasks", "tenants", "p90",
             "check", "version"]


@HOSTILE
@given(key=st.sampled_from(META_KEYS), value=json_values,  # metadata is JSON
       which=st.sampled_from(["meta", "p50", "p90"]), cut=st.integers(0, 3))
def test_a_mangled_bundle_is_refused_with_a_reason(bundle, key, value, which, cut):
    meta = copy.deepcopy(bundle.meta)
    p50, p90 = bundle.p50_text, bundle.p90_text
    if which == "meta":
        meta[key] = value
    elif which == "p50":
        p50 = p50[: len(p50) * cut // 4]
    else:
        p90 = p90[: len(p90) * cut // 4] + (value if isinstance(value, str) else "")
    try:
        loaded = load_bundle(ModelBundle(meta, p50, p90))
    except ModelError as exc:
        assert str(exc)
        return
    p50_s, p90_s = loaded.compiled.raw([math.nan] * len(loaded.spec.names))
    assert math.isfinite(p50_s) and math.isfinite(p90_s)


@pytest.mark.parametrize("name,content", [
    ("meta.json", b"\xff\xfe{}"), ("meta.json", deep_json_text(100_000).encode()),
    ("meta.json", b"[1]"), ("p50.txt", b"\x80\x81"), ("p90.txt", b""),
])
def test_a_damaged_model_directory_raises_model_error(bundle, tmp_path: Path, name, content):
    bundle.save(tmp_path)
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ModelError):
        load_bundle(ModelBundle.read(tmp_path))


def test_huge_numbers_in_check_rows_are_a_model_error(bundle):
    meta = copy.deepcopy(bundle.meta)
    meta["check"]["raw50"][0] = 10**400  # json.loads gives this int; float() overflows
    with pytest.raises(ModelError, match="check row"):
        load_bundle(ModelBundle(json.loads(json.dumps(meta)), bundle.p50_text,
                                bundle.p90_text))


@HOSTILE
@given(args=st.one_of(st.lists(py_values, max_size=6), py_values),
       kwargs=st.one_of(st.dictionaries(st.one_of(odd_text, odd_bytes), py_values, max_size=6),
                        py_values),
       sizes=st.tuples(py_values, py_values), hint=py_values, retries=py_values,
       published=py_values)
def test_features_of_any_arguments_never_raise(args, kwargs, sizes, hint, retries, published):
    out = argument_features(args, kwargs, *sizes)
    assert all(type(v) in (int, float) for v in out.values())
    json.dumps({k: (None if v != v else v) for k, v in out.items()}, allow_nan=False)
    spec = FeatureSpec(["a", "b"], ["t"], ["acme"])
    vector = spec.vector("t", "acme", args, kwargs, *sizes, hint, retries, published, None)
    assert len(vector) == len(spec.names)
    assert all(type(v) in (int, float) for v in vector)
