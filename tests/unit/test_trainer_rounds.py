"""Trainer rounds: counting new observations in a capped stream, promotion against a pin
that appears meanwhile, and the trainer lock (one trainer at a time)."""

from __future__ import annotations

import time
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

import celery_aitp.cli.celery_command  # noqa: F401 - it imports the trainer module last
from celery_aitp.cli import train as train_module
from celery_aitp.cli import trainer as trainer_module
from celery_aitp.cli.trainer import Trainer
from celery_aitp.learn.lock import lock_key
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


# --- the trainer lock -----------------------------------------------------------------


def test_a_round_that_outlived_its_lock_leaves_the_next_trainers_lock(
        app, store, monkeypatch, capsys):
    key = lock_key(store)
    store.append_records(store.keys.observations, [{"task": "t"}], 10_000)

    def outlived(*args: Any, **kwargs: Any) -> None:  # the lock expired, another took it
        store.client.delete(key)
        assert store.try_lock(key, 60, "next trainer")

    monkeypatch.setattr(trainer_module, "train_and_promote", outlived)
    Trainer(app.aitp, every_s=0.01, min_new=50, limit=None).round()
    assert store.client.get(key) == b"next trainer"  # was deleted by the old round
    assert "lock expired during this round" in capsys.readouterr().out


def test_the_lock_is_renewed_while_a_round_trains_and_released_after(
        app, store, monkeypatch):
    key = lock_key(store)
    store.append_records(store.keys.observations, [{"task": "t"}], 10_000)
    held: list[Any] = []

    def long_round(*args: Any, **kwargs: Any) -> None:
        time.sleep(1.0)  # over three times the lock's expiry
        held.append(store.client.get(key))

    monkeypatch.setattr(trainer_module, "train_and_promote", long_round)
    trainer = Trainer(app.aitp, every_s=0.01, min_new=50, limit=None)
    trainer.lock_ttl_s = 0.3
    trainer.round()
    assert held and held[0] is not None  # still ours at the end of the long round
    assert store.client.get(key) is None  # given back


def test_a_round_skips_while_another_trainer_holds_the_lock(app, store, rounds, capsys):
    store.append_records(store.keys.observations, [{"task": "t"}], 10_000)
    assert store.try_lock(lock_key(store), 60, "host-b pid 7")
    Trainer(app.aitp, every_s=0.01, min_new=50, limit=None).round()
    assert not rounds and "another trainer holds the lock (host-b pid 7)" in (
        capsys.readouterr().out)


def test_app_train_takes_the_trainer_lock(app, store, trained, monkeypatch):
    from click.testing import CliRunner

    from celery_aitp.cli.celery_command import aitp

    key = lock_key(store)
    store.append_records(store.keys.observations, [{"task": "t"}], 10_000)
    seen: list[Any] = []

    def train(records: Any, config: Any = None, report: Any = None) -> Any:
        seen.append(store.client.get(key))
        return replace(trained, bundle=named(trained.bundle, f"v{len(seen)}"))

    monkeypatch.setattr(train_module, "train", train)
    assert store.try_lock(key, 60, "host-b pid 7")
    held = CliRunner().invoke(aitp, ["train"], obj=SimpleNamespace(app=app))
    assert held.exit_code == 3, held.output
    assert "another trainer holds the trainer lock (host-b pid 7)" in held.output
    assert not seen and ModelStore(store).version() is None  # nothing trained
    assert store.client.get(key) == b"host-b pid 7"  # not taken away

    store.client.delete(key)
    done = CliRunner().invoke(aitp, ["train"], obj=SimpleNamespace(app=app))
    assert done.exit_code == 0, done.output
    assert seen and seen[0] is not None  # trained under the lock
    assert ModelStore(store).version() == "v1" and store.client.get(key) is None


def test_a_lock_is_extended_only_by_its_owner(store) -> None:
    key = lock_key(store)
    assert store.try_lock(key, 0.5, "a")
    assert not store.extend_lock(key, 60, "b")
    assert store.extend_lock(key, 60, "a") and store.client.pttl(key) > 50_000
    store.client.delete(key)
    assert not store.extend_lock(key, 60, "a")  # an expired lock is not brought back
    assert store.client.get(key) is None
