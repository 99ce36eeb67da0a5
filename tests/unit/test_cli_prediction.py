"""The train, trainer, model and predict commands (click's CliRunner, fake store)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from celery_aitp.cli.celery_command import aitp
from celery_aitp.cli.standalone import main
from celery_aitp.cli.trainer import Trainer
from celery_aitp.cli.training import parse_duration
from celery_aitp.predict.model_store import ModelStore


@pytest.fixture
def runs_file(synthetic_records: list[dict[str, Any]]) -> Any:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "runs.jsonl"
        lines = [json.dumps(r) for r in synthetic_records[:1500]]
        lines.insert(10, "{not json")
        lines.insert(20, json.dumps({"task": "x", "tenant": "a", "runtime_s": -3,
                                     "published_at": 1.0}))
        path.write_text("\n".join(lines) + "\n")
        yield path


def invoke_app(app: Any, *args: str) -> Any:
    return CliRunner().invoke(aitp, list(args), obj=SimpleNamespace(app=app),
                              catch_exceptions=False)


def test_standalone_train_writes_a_model_and_reports(runs_file):
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "model"
        result = CliRunner().invoke(main, ["train", "--observations", str(runs_file),
                                           "--out", str(out)], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        assert "used 1500 of 1502 records; skipped 2 (" in result.output
        assert "not JSON: 1" in result.output and "negative runtime_s: 1" in result.output
        for name in ("model", "global median", "per-task mean", "last two"):
            assert name in result.output
        assert "promotable" in result.output
        assert sorted(p.name for p in out.iterdir()) == ["meta.json", "p50.txt", "p90.txt"]

        predicted = CliRunner().invoke(main, ["predict", "--model", str(out),
                                              "--observations", str(runs_file)],
                                       catch_exceptions=False)
    lines = [json.loads(line) for line in predicted.stdout.splitlines()]
    assert len(lines) == 1502
    assert lines[10] == {"error": "not JSON"}
    assert lines[20]["error"] == "negative runtime_s"
    assert lines[0]["predicted_runtime_s"] > 0 and "predicted_p90_s" in lines[0]
    assert "2 of 1502 records could not be predicted" in predicted.stderr


def test_predict_with_a_missing_model_fails_clearly(runs_file):
    result = CliRunner().invoke(main, ["predict", "--model", "/nonexistent/model",
                                       "--observations", str(runs_file)])
    assert result.exit_code == 2 and "not a model directory" in result.output


def test_app_train_promotes_and_model_shows_it(app, store, runs_file):
    result = invoke_app(app, "train", "--observations", str(runs_file))
    assert result.exit_code == 0, result.output
    assert "promoted" in result.output
    version = ModelStore(store).version()
    assert version is not None
    shown = invoke_app(app, "model")
    assert version in shown.output and "last two" in shown.output
    as_json = json.loads(invoke_app(app, "model", "--json").output)
    assert as_json["current"]["version"] == version and "check" not in as_json["current"]


def test_app_train_dry_run_does_not_promote(app, store, runs_file):
    result = invoke_app(app, "train", "--observations", str(runs_file), "--dry-run")
    assert "dry run: not promoted" in result.output
    assert ModelStore(store).version() is None
    assert "no runtime model yet" in invoke_app(app, "model").output


def test_app_train_from_the_store(app, store, synthetic_records):
    store.append_records(store.keys.observations, synthetic_records[:800], 10_000)
    result = invoke_app(app, "train")
    assert "used 800 of 800 records" in result.output
    assert result.exit_code == 0 and ModelStore(store).version() is not None


def test_app_train_without_enough_records_exits_1(app, store, synthetic_records):
    store.append_records(store.keys.observations, synthetic_records[:30], 10_000)
    result = invoke_app(app, "train", "--min-records", "1000")
    assert "too few usable records" in result.output
    assert result.exit_code == 1  # a scheduled job sees that no model came out
    assert ModelStore(store).version() is None


def test_trainer_rounds_skip_until_there_is_something_new(app, store, synthetic_records,
                                                          capsys):
    trainer = Trainer(app.aitp, every_s=0.01, min_new=50, limit=None)
    trainer.run(rounds=1)
    assert "no observations yet" in capsys.readouterr().out
    store.append_records(store.keys.observations, synthetic_records[:600], 10_000)
    trainer.run(rounds=1)
    first = ModelStore(store).version()
    assert first is not None
    capsys.readouterr()
    trainer.run(rounds=1)
    assert "no new observations" in capsys.readouterr().out
    store.append_records(store.keys.observations, synthetic_records[600:620], 10_000)
    trainer.run(rounds=1)
    assert "only 20 new observations" in capsys.readouterr().out
    assert ModelStore(store).version() == first


def test_trainer_command_runs_rounds(app, store, synthetic_records):
    store.append_records(store.keys.observations, synthetic_records[:600], 10_000)
    result = invoke_app(app, "trainer", "--every", "1s", "--rounds", "1")
    assert result.exit_code == 0 and "trainer: every 1 s" in result.output
    assert ModelStore(store).version() is not None


def test_durations():
    assert parse_duration("10m") == 600 and parse_duration("1.5h") == 5400
    assert parse_duration("45") == 45
    with pytest.raises(Exception, match="positive duration"):
        parse_duration("soon")


def test_a_trainer_waits_out_a_pin_and_then_learns_from_what_came_meanwhile(
        app, store, synthetic_records, capsys):
    from celery_aitp.predict.model_store import Actor

    models = ModelStore(store)
    store.append_records(store.keys.observations, synthetic_records[:600], 10_000)
    trainer = Trainer(app.aitp, every_s=0.01, min_new=50, limit=None)
    trainer.run(rounds=1)
    first = models.version()
    assert first is not None
    actor = Actor("alice", "hold", "desk", at=1_700_000_000.0)
    models.pin(first, actor)
    store.append_records(store.keys.observations, synthetic_records[600:1400], 10_000)
    capsys.readouterr()
    trainer.run(rounds=1)
    assert f"model {first} is pinned" in capsys.readouterr().out  # nothing trained
    models.unpin(actor)
    trainer.run(rounds=1)  # the 800 runs that came while pinned are new to it still
    out = capsys.readouterr().out
    assert "no new observations" not in out and "used 1400 of 1400 records" in out


def test_min_records_below_what_a_model_can_be_checked_with_is_refused(app):
    out = invoke_app(app, "train", "--min-records", "20")  # failed with an internal error
    assert out.exit_code == 2 and "--min-records" in out.output and "40" in out.output


def test_train_reads_a_gzip_file_and_counts_its_cut_end(runs_file, tmp_path):
    """replay read .jsonl.gz; train read each compressed line as 'not JSON'."""
    import gzip

    packed = tmp_path / "runs.jsonl.gz"
    packed.write_bytes(gzip.compress(runs_file.read_bytes()))
    result = CliRunner().invoke(main, ["train", "--observations", str(packed), "--out",
                                       str(tmp_path / "model")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "used 1500 of 1502 records" in result.output
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(packed.read_bytes()[: packed.stat().st_size // 2])
    result = CliRunner().invoke(main, ["train", "--observations", str(cut), "--out",
                                       str(tmp_path / "m2")], catch_exceptions=False)
    assert "truncated file: 1" in result.output
