"""Trainer rounds: counting new observations in a capped stream, promotion against a pin
that appears meanwhile, and the trainer lock (one trainer at a time)."""

from __future__ import annotations

from typing import Any

import pytest

import celery_aitp.cli.celery_command  # noqa: F401 - it imports the trainer module last
from celery_aitp.cli import trainer as trainer_module
from celery_aitp.cli.trainer import Trainer


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
