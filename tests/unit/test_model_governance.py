"""Model governance: keep the last N models, pin, roll back (audited), promote only
models that beat the one in use on the same window."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from celery_aitp.cli.celery_command import aitp
from celery_aitp.cli.train import train_and_promote
from celery_aitp.errors import ModelError
from celery_aitp.learn.train import TrainConfig, current_model_error, train
from celery_aitp.predict.bundle import ModelBundle
from celery_aitp.predict.model_store import Actor, ModelStore


def named(bundle: ModelBundle, version: str) -> ModelBundle:
    return ModelBundle({**bundle.meta, "version": version}, bundle.p50_text, bundle.p90_text)


def operator(why: str = "test") -> Actor:
    return Actor("alice", why, "desk-7 pid 1", at=1_700_000_000.0)


def invoke(app: Any, *args: str) -> Any:
    return CliRunner().invoke(aitp, list(args), obj=SimpleNamespace(app=app),
                              catch_exceptions=False)


def test_only_the_last_n_models_are_kept(store, trained):
    models = ModelStore(store, keep=3)
    for i in range(1, 6):
        models.promote(named(trained.bundle, f"v{i}"))
    assert models.kept() == ["v5", "v4", "v3"]
    assert models.kept_bundle("v3").version == "v3"
    with pytest.raises(ModelError, match="not kept"):
        models.kept_bundle("v2")
    assert sorted(store.client.hkeys(models.bundles_key)) == [b"v3", b"v4", b"v5"]


def test_pin_makes_a_kept_model_current_and_is_audited(store, trained):
    models = ModelStore(store)
    for i in range(1, 4):
        models.promote(named(trained.bundle, f"v{i}"))
    assert models.pin("v1", operator("v3 mispredicts reports")) == "v3"
    assert models.version() == "v1" and models.pinned() == "v1"
    entry = models.audit()[0]
    assert entry == {"action": "pin", "version": "v1", "from_version": "v3", "who": "alice",
                     "why": "v3 mispredicts reports", "where": "desk-7 pid 1",
                     "at": 1_700_000_000.0}
    with pytest.raises(ModelError, match="not kept"):
        models.pin("v9", operator())
    assert models.version() == "v1" and len(models.audit()) == 1


def test_a_kept_model_that_does_not_verify_is_not_pinned(store, trained):
    models = ModelStore(store)
    models.promote(named(trained.bundle, "good"))
    broken = named(trained.bundle, "broken")
    broken.meta["check"] = {**broken.meta["check"], "raw50": [9.0] * len(
        broken.meta["check"]["raw50"])}
    models.promote(broken)
    models.pin("good", operator())
    with pytest.raises(ModelError):
        models.pin("broken", operator())
    assert models.version() == "good"


def test_rollback_walks_back_through_the_kept_models(store, trained):
    models = ModelStore(store)
    for i in range(1, 4):
        models.promote(named(trained.bundle, f"v{i}"))
    assert models.rollback(operator("bad deploy")) == "v2"
    assert models.version() == "v2" and models.pinned() == "v2"
    assert models.rollback(operator()) == "v1"
    with pytest.raises(ModelError, match="no kept model older"):
        models.rollback(operator())
    actions = [(a["action"], a["version"], a["from_version"]) for a in models.audit()]
    assert actions == [("rollback", "v1", "v2"), ("rollback", "v2", "v3")]
    assert models.unpin(operator("fixed")) == "v1" and models.pinned() is None


def test_the_trainer_does_not_promote_over_a_pin(app, store, trained, synthetic_records):
    models = ModelStore(store)
    models.promote(named(trained.bundle, "old"))
    models.pin("old", operator())
    store.append_records(store.keys.observations, synthetic_records[:1500], 10_000)
    result = train_and_promote(app.aitp, None, None, None, False, show_progress=False,
                               config=TrainConfig(rounds=20))
    assert result.promotable  # it beats the baseline, but the pin holds
    assert models.version() == "old"


def test_promotion_needs_to_beat_the_model_in_use_on_the_same_window(
        app, store, synthetic_records):
    models = ModelStore(store)
    store.append_records(store.keys.observations, synthetic_records[:1500], 10_000)
    config = TrainConfig(rounds=40)
    weak = train(synthetic_records[:150], TrainConfig(rounds=2, min_records=100))
    assert weak.bundle is not None
    models.promote(weak.bundle)
    first = train_and_promote(app.aitp, None, None, None, False, show_progress=False,
                              config=config)
    assert models.version() == first.bundle.version  # beat the weak model: promoted
    # the model in use was refit on the validation window, so a model trained without
    # it scores worse there: it must not replace the one in use
    second = train_and_promote(app.aitp, None, None, None, False, show_progress=False,
                               config=config)
    assert current_model_error(second, models.read()) <= second.score("model").log_error
    assert not second.promotable and "current model" in second.reason
    assert models.version() == first.bundle.version


def test_model_commands_pin_rollback_unpin(app, store, trained):
    models = ModelStore(store)
    for i in range(1, 3):
        models.promote(named(trained.bundle, f"v{i}"))
    out = invoke(app, "model", "pin", "v1", "--reason", "hold", "--by", "bob")
    assert out.exit_code == 0 and "pinned model v1 (was v2)" in out.output
    assert models.audit()[0]["who"] == "bob" and models.audit()[0]["why"] == "hold"
    missing = CliRunner().invoke(aitp, ["model", "pin", "v1"], obj=SimpleNamespace(app=app))
    assert missing.exit_code != 0  # --reason is required
    assert invoke(app, "model", "unpin", "--reason", "done").exit_code == 0
    models.promote(named(trained.bundle, "v3"))
    out = invoke(app, "model", "rollback", "--reason", "regression")
    assert "rolled back to model v2" in out.output  # kept, newest first: v3, v2, v1
    shown = json.loads(invoke(app, "model", "--json").output)
    assert shown["pinned"] == "v2" and shown["audit"][0]["action"] == "rollback"
    assert shown["kept"] == ["v3", "v2", "v1"]

