"""Model bundles: saved as LightGBM text + JSON, verified on load, refused when unusable."""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import pytest

from celery_aitp.errors import ModelError
from celery_aitp.predict.bundle import ModelBundle, load_bundle
from celery_aitp.predict.model_source import ModelSource
from celery_aitp.predict.model_store import ModelStore


def copy(bundle: ModelBundle, **meta: object) -> ModelBundle:
    return ModelBundle({**bundle.meta, **meta}, bundle.p50_text, bundle.p90_text)


def test_a_saved_model_is_text_and_loads_back(trained):
    with tempfile.TemporaryDirectory() as tmp:
        path = trained.bundle.save(Path(tmp) / "model")
        assert sorted(p.name for p in path.iterdir()) == ["meta.json", "p50.txt", "p90.txt"]
        assert (path / "p50.txt").read_text().startswith("tree")
        meta = json.loads((path / "meta.json").read_text())
        assert meta["feature_names"][:2] == ["task", "tenant"] and meta["version"]
        loaded = load_bundle(ModelBundle.read(path))
    assert loaded.version == trained.bundle.version
    assert loaded.spec.names == tuple(meta["feature_names"])


@pytest.mark.parametrize("spoil, message", [
    (lambda b: ModelBundle(b.meta, "tree\nnot a model", b.p90_text),
     r"p50 model \(p50.txt\): .*truncated"),
    (lambda b: ModelBundle(b.meta, b.p50_text, b.p90_text[: len(b.p90_text) // 2]),
     r"p90 model \(p90.txt\): .*truncated"),
    (lambda b: ModelBundle(b.meta, b.p50_text.replace("left_child=", "left_child=7 "),
                           b.p90_text), r"p50 model \(p50.txt\): left_child"),
    (lambda b: ModelBundle(b.meta, b.p50_text.replace("feature_names=task", "feature_names=job"),
                           b.p90_text), "feature names"),
    (lambda b: copy(b, check={}), "check rows"),
    (lambda b: copy(b, format="other/2"), "unknown model format"),
    (lambda b: copy(b, schema=99), "feature schema"),
    (lambda b: copy(b, feature_names=["task"]), "feature list"),
    (lambda b: copy(b, kwarg_names=["nope"]), "feature list"),
    (lambda b: copy(b, p90="absolute"), "p90 model kind"),
    (lambda b: copy(b, check={**b.meta["check"],
                              "raw50": [x + 1 for x in b.meta["check"]["raw50"]]}),
     "does not reproduce"),
])
def test_corrupt_or_incompatible_models_are_refused(trained, spoil, message):
    with pytest.raises(ModelError, match=message):
        load_bundle(spoil(trained.bundle))


def test_reading_a_missing_model_directory_names_it():
    with tempfile.TemporaryDirectory() as tmp, pytest.raises(ModelError, match="not a model"):
        ModelBundle.read(Path(tmp) / "missing")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "meta.json").write_text("{")
        with pytest.raises(ModelError, match="p50.txt|not JSON"):
            ModelBundle.read(tmp)


def test_the_source_picks_up_new_versions_and_keeps_the_last_good_one(store, trained, caplog):
    source, models = ModelSource(), ModelStore(store)
    assert source.fetch(store, None) is None  # nothing promoted yet: cold start
    models.promote(trained.bundle)
    first = source.fetch(store, None)
    assert first is not None and first.version == trained.bundle.version
    assert source.fetch(store, first) is first  # unchanged version: nothing reloaded

    broken = copy(trained.bundle, version="v-broken", schema=99)
    models.promote(broken)
    with caplog.at_level(logging.ERROR, logger="celery_aitp.predict.model_source"):
        assert source.fetch(store, first) is first
        assert source.fetch(store, first) is first  # refused once, not retried every round
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "refusing runtime model v-broken" in errors[0] and trained.bundle.version in errors[0]

    models.promote(copy(trained.bundle, version="v-next"))
    assert source.fetch(store, first).version == "v-next"
    store.client.delete(store.keys.model)
    assert source.fetch(store, first) is None  # withdrawn: back to cold start
    assert [h["version"] for h in models.history()][:2] == ["v-next", "v-broken"]


def test_a_corrupt_text_given_to_lightgbm_names_the_model_it_is():
    from celery_aitp.predict.bundle import booster_from_text

    with pytest.raises(ModelError, match="current p90 model: .*truncated"):
        booster_from_text("tree\nnot a model", "current p90 model")
