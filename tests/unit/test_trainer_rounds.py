"""Trainer rounds: counting new observations in a capped stream, promotion against a pin
that appears meanwhile, and the trainer lock (one trainer at a time)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

import celery_aitp.cli.celery_command  # noqa: F401 - it imports the trainer module last
from celery_aitp.cli import train as train_module
from celery_aitp.cli import trainer as trainer_module
from celery_aitp.cli.trainer import Trainer
from celery_aitp.predict.bundle import ModelBundle
from celery_aitp.predict.model_store import Actor, ModelStore


def capped(store: Any, records: list[dict[str, Any]], cap: int) -> None:
    """Append as the workers do, then trim exactly to ``cap`` (fakeredis does not trim
    ``MAXLEN ~``; Redis trims whole nodes, to the same effect once the stream is full)."""
    key = store.keys.observations
    store.append_records(key, records, cap)
    store.client.xtrim(key, maxlen=cap, approximate=False)


@pytest.fixture
def rounds(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Replaces training in the trainer's rounds: each call is recorded, nothing trains."""
    calls: list[Any] = []
    monkeypatch.setattr(trainer_module, "train_and_promote",
                        lambda *args, **kwargs: calls.append(args))
    return calls


def test_a_full_capped_stream_still_counts_new_observations(app, store, rounds, capsys):
    cap = 300
    records = [{"task": "t", "tenant": "a", "runtime_s": 1.0, "published_at": float(i)}
               for i in range(1000)]
    capped(store, records[:cap], cap)
    trainer = Trainer(app.aitp, every_s=0.01, min_new=50, limit=None)
    trainer.round()
    assert len(rounds) == 1  # the first round trains on what is there
    capped(store, records[cap:cap + 20], cap)
    trainer.round()
    assert "only 20 new observations" in capsys.readouterr().out and len(rounds) == 1
    capped(store, records[cap + 20:cap + 120], cap)  # 120 new; the length stays at the cap
    assert store.client.xlen(store.keys.observations) == cap
    trainer.round()
    out = capsys.readouterr().out
    assert len(rounds) == 2, out  # by length: "only 0 new observations"
    capped(store, records[cap + 120:], cap)  # more than the cap: the last seen is trimmed
    trainer.round()
    assert len(rounds) == 3


# --- a pin that appears while the new model is scored ---------------------------------


def named(bundle: ModelBundle, version: str) -> ModelBundle:
    return ModelBundle({**bundle.meta, "version": version}, bundle.p50_text, bundle.p90_text)


def operator() -> Actor:
    return Actor("alice", "hold", "desk-7 pid 1", at=1_700_000_000.0)


def test_a_pin_made_while_the_new_model_is_scored_is_not_overwritten(
        app, store, trained, monkeypatch, capsys):
    models = ModelStore(store)
    models.promote(named(trained.bundle, "old"))
    store.append_records(store.keys.observations, [{"task": "t"}], 10_000)
    monkeypatch.setattr(train_module, "train", lambda records, config=None, report=None:
                        replace(trained, bundle=named(trained.bundle, "new")))

    def slow_scoring(models_: ModelStore, result: Any, say: Any = None) -> None:
        models.pin("old", operator())  # an operator pins while the trainer scores
        return None  # the new model beat the one in use (before the pin)

    monkeypatch.setattr(train_module, "promotion_refusal", slow_scoring)
    train_module.train_and_promote(app.aitp, None, None, None, False, show_progress=False)
    assert "pinned meanwhile: not promoted" in capsys.readouterr().out
    assert models.version() == "old" and models.pinned() == "old"  # the pin is in use
    assert "new" not in models.kept()


def test_promote_unless_pinned_checks_the_pin_in_the_same_transaction(store, trained):
    models = ModelStore(store)
    models.promote(named(trained.bundle, "v1"))
    write = models._make_current
    pinned_once: list[bool] = []

    def pin_between_check_and_write(pipe: Any, bundle: ModelBundle) -> None:
        if not pinned_once:  # after the pin was read, before the transaction runs
            pinned_once.append(True)
            models.pin("v1", operator())
        write(pipe, bundle)

    models._make_current = pin_between_check_and_write  # type: ignore[method-assign]
    assert models.promote(named(trained.bundle, "v2"), unless_pinned=True) == "v1"
    assert models.version() == "v1" and models.kept() == ["v1"]
    models.unpin(operator())
    assert models.promote(named(trained.bundle, "v2"), unless_pinned=True) is None
    assert models.version() == "v2"
