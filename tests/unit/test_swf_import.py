"""``celery-aitp import-swf``: SWF job logs become observation records training can read."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from click.testing import CliRunner

from celery_aitp.cli.standalone import main
from celery_aitp.learn.dataset import build_dataset, read_jsonl
from celery_aitp.learn.swf import SwfResult, swf_records

HEADER = """; Version: 2.2
; UnixStartTime: 1000000
; Note: a tiny hand-made log
"""
# job submit wait run alloc cpu mem req_procs req_time req_mem status user group exe queue part ...
JOBS = """\
    1     0    10   100   4  -1 -1   4   200  -1  1   7   3   2   1  -1 -1 -1
    2     5     0    50   8  -1 -1  -1    -1  -1  0   7   3  -1  -1  -1 -1 -1
    3    20     0     0   1  -1 -1   1    60  -1  1   8   3   2   1  -1 -1 -1
    4    30     5   900   2  -1 -1   2  1000  -1  5   8   3   2   1  -1 -1 -1
    5    40    -1    30   1  -1 -1   1    60  -1  1  -1  -1   5   2   1 -1 -1
    6    41     0  oops   1  -1 -1   1    60  -1  1   8   3   2   1  -1 -1 -1
    7    42     0
; a comment between jobs
"""


def convert(text: str, start: float | None = None) -> tuple[list[dict], SwfResult]:
    result = SwfResult()
    return list(swf_records(text.splitlines(), result, start)), result


def test_fields_map_to_what_was_known_at_submission():
    records, result = convert(HEADER + JOBS)
    assert [r["task_id"] for r in records] == ["swf-1", "swf-2", "swf-5"]
    first, second, third = records
    assert first["task"] == "exe2" and first["tenant"] == "user7"
    assert first["published_at"] == 1_000_000 and first["started_at"] == 1_000_010
    assert first["runtime_s"] == 100
    assert first["kwargs"] == {"procs": 4, "requested_time_s": 200, "queue": 1, "group": 3}
    assert first["features"]["kw.requested_time_s"] == 200
    # unknown executable -> "job"; requested processors unknown -> allocated ones;
    # unknown requested time, queue and partition are left out, not -1
    assert second["task"] == "job"
    assert second["kwargs"] == {"procs": 8, "group": 3}
    # unknown user -> "unknown"; unknown wait -> starts when submitted
    assert third["tenant"] == "unknown" and third["started_at"] == third["published_at"]
    assert third["kwargs"]["partition"] == 1 and "group" not in third["kwargs"]
    assert result.written == 3
    assert result.skipped == {"run time <= 0": 1, "cancelled": 1, "not numbers": 1,
                              "not 18 fields": 1}
    assert "skipped 4" in result.summary()


def test_start_option_and_missing_header():
    records, result = convert(JOBS, start=500.0)
    assert records[0]["published_at"] == 500.0
    records, result = convert(JOBS)
    assert records[0]["published_at"] > 0  # a default epoch, said in the summary
    assert "no UnixStartTime" in result.summary()


def test_command_writes_records_that_train_reads(tmp_path: Path):
    trace = tmp_path / "tiny.swf.gz"
    with gzip.open(trace, "wt") as handle:
        handle.write(HEADER + JOBS)
    out = tmp_path / "runs.jsonl"
    run = CliRunner().invoke(main, ["import-swf", str(trace), "--out", str(out)])
    assert run.exit_code == 0, run.output
    assert "wrote 3 records; skipped 4" in run.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 3
    dataset = build_dataset(read_jsonl(out))
    assert len(dataset) == 3 and not dataset.skipped
    # three different (tenant, task) pairs: nobody has history yet
    assert all(obs.history is None for obs in dataset.observations)


def test_history_counts_only_runs_finished_before_publication():
    jobs = """\
    1     0     0   10   1  -1 -1   1   60  -1  1   7   3   2   1  -1 -1 -1
    2     5     0   10   1  -1 -1   1   60  -1  1   7   3   2   1  -1 -1 -1
    3    12     0   30   1  -1 -1   1   60  -1  1   7   3   2   1  -1 -1 -1
"""
    records, _ = convert(HEADER + jobs)
    dataset = build_dataset(records)
    second, third = dataset.observations[1], dataset.observations[2]
    assert second.history is None  # job 1 still running at t=5
    assert third.history is not None and third.history[2] == 1  # only job 1 (job 2 ends at 15)


def test_damaged_gzip_is_a_clear_error(tmp_path: Path):
    trace = tmp_path / "cut.swf.gz"
    trace.write_bytes(gzip.compress((HEADER + JOBS).encode())[:30])
    run = CliRunner().invoke(main, ["import-swf", str(trace), "--out", str(tmp_path / "o")])
    assert run.exit_code == 2
    assert "cannot convert" in run.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.swf.gz"]  # no half file
