"""Replay input and output: trace validation, metrics, the HTML report, both commands."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from celery_aitp.cli.celery_command import aitp
from celery_aitp.cli.standalone import main
from celery_aitp.fairness import jain_index
from celery_aitp.replay.metrics import (
    GroupStats,
    RunStats,
    bounded_slowdown,
    run_stats,
    targets,
)
from celery_aitp.replay.report import RunSeries, depth_series, html_report
from celery_aitp.replay.trace import load_jsonl, write_jsonl
from tests.conftest import TEST_POLICY


def write_trace(path: Path, n: int = 40) -> Path:
    records = []
    for i in range(n):
        tenant, tier = (("acme", "hi"), ("globex", "mid"), ("default", "lo"))[i % 3]
        records.append({"task": f"t{i % 3}", "tenant": tenant, "tier": tier,
                        "accelerator": "gpu" if i % 5 == 0 else "cpu", "args": [i],
                        "kwargs": {}, "published_at": 1000.0 + i * 0.1, "runtime_s": 0.3,
                        "started_at": 1000.0 + i * 0.1})
    write_jsonl(records, path)
    return path


def test_bad_records_are_skipped_and_counted(tmp_path):
    path = tmp_path / "t.jsonl"
    good = {"task": "t", "published_at": 10.0, "runtime_s": 1.0}
    lines = [json.dumps(good), "not json", json.dumps([1, 2]), json.dumps({"task": ""}),
             json.dumps({**good, "runtime_s": -1}), '{"task": "t", "published_at": 1, '
             '"runtime_s": NaN}', json.dumps({**good, "published_at": "yesterday"}),
             json.dumps({**good, "args": "oops", "kwargs": 3, "tenant": 7}), ""]
    path.write_text("\n".join(lines))
    trace = load_jsonl(path)
    assert len(trace) == 2
    assert trace.records[1]["args"] == [] and trace.records[1]["kwargs"] == {}
    assert trace.records[1]["tenant"] is None
    assert trace.skipped == {"not JSON": 1, "not an object": 1, "missing task": 1,
                             "bad runtime_s": 2, "bad published_at": 1}
    assert trace.skipped_summary().startswith("skipped 6 record(s): bad runtime_s 2")


def test_gzipped_traces_round_trip(tmp_path):
    records = [{"task": "t", "published_at": 10.0 + i, "runtime_s": 0.5} for i in range(3)]
    assert write_jsonl(records, tmp_path / "t.jsonl.gz") == 3
    assert (tmp_path / "t.jsonl.gz").read_bytes()[:2] == b"\x1f\x8b"
    assert load_jsonl(tmp_path / "t.jsonl.gz").published == [10.0, 11.0, 12.0]


def test_bounded_slowdown_jain_and_sla():
    slow = bounded_slowdown(np.array([0.0, 1.0, 1.0]), np.array([2.0, 0.005, 1.0]))
    assert slow.tolist() == [1.0, pytest.approx(10.05), 2.0]
    assert jain_index([1, 1, 1]) == 1.0
    assert jain_index([1, 0, 0]) == pytest.approx(1 / 3)
    assert jain_index([]) is None
    stats = run_stats("r", [0.1, 0.2, 9.0], [1.0, 1.0, 1.0], ["hi", "hi", "lo"],
                      ["a", "b", "b"], {"hi": 0.15, "lo": 5.0}, ["hi", "mid", "lo"], lost=2)
    assert [g.name for g in stats.groups] == ["hi", "lo", "a", "b", "all"]
    hi = stats.group("tier", "hi")
    assert hi and hi.tasks == 2 and hi.sla_hit == 0.5 and hi.wait_max_s == 0.2
    assert stats.overall.sla_hit == pytest.approx(1 / 3) and stats.lost == 2


def _stats(run, hi_p95, lo_max, slowdown):
    groups = [GroupStats("tier", "hi", 1, 0, hi_p95, hi_p95, 1, None),
              GroupStats("tier", "lo", 1, 0, lo_max, lo_max, 1, None),
              GroupStats("all", "all", 2, 0, 0, 0, slowdown, None)]
    return RunStats(run, groups)


def test_targets_are_the_three_ratios():
    found = targets(_stats("fifo", 10, 10, 5), _stats("p", 1, 25, 2.2), _stats("o", 0, 0, 2.0),
                    ["hi", "mid", "lo"])
    assert [(t.name, round(t.value, 3), t.limit, t.met) for t in found] == [
        ("hi tier p95 wait / FIFO's", 0.1, 0.2, True),
        ("mean slowdown / oracle's", 1.1, 1.15, True),
        ("lo tier longest wait / FIFO's", 2.5, 2.0, False)]


def test_depth_over_time_counts_published_not_started():
    run = RunSeries("r", [0.0, 1.0, 1.0], [2.0, 1.5, math.nan], ["hi", "hi", "hi"])
    assert depth_series(run, "hi", np.array([0.5, 1.2, 1.8, 3.0]), 0.0) == [1, 3, 2, 1]


def test_report_is_self_contained():
    run = RunSeries("fifo", [0.0, 1.0], [0.5, 3.0], ["hi", "lo"])
    stats = run_stats("fifo", [0.5, 2.0], [1.0, 1.0], ["hi", "lo"], ["a", "a"], {}, ["hi", "lo"])
    page = html_report("t", ["a <meta> line"], [stats], [], [run], ["hi", "lo"])
    assert page.count("<svg") >= 4 and "<polyline" in page and "&lt;meta&gt;" in page
    external = [part for part in page.split('"') if part.startswith(("http:", "https:", "//"))]
    assert external == ["http://www.w3.org/2000/svg"] * len(external)  # only the namespace
    assert "<script" not in page


def trace_and_policy(tmp_path: Path) -> tuple[Path, Path]:
    """A trace of 40 runs and the test policy, as files."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(TEST_POLICY))
    return write_trace(tmp_path / "trace.jsonl"), policy


def test_offline_replay_command(tmp_path):
    trace, policy = trace_and_policy(tmp_path)
    report = tmp_path / "r.html"
    result = CliRunner().invoke(main, ["replay", str(trace), "--policy", str(policy),
                                       "--vs", str(policy), "--report", str(report)])
    assert result.exit_code == 0, result.output
    assert "policy'" in result.output and "fifo" in result.output and "oracle" in result.output
    assert "mean slowdown / oracle's" in result.output
    assert "40 runs" in result.output and report.read_text().startswith("<!doctype html>")


def test_offline_replay_with_an_express_worker(tmp_path):
    trace, policy = trace_and_policy(tmp_path)
    report = tmp_path / "r.html"
    result = CliRunner().invoke(main, ["replay", str(trace), "--policy", str(policy),
                                       "--express", "1", "--report", str(report)])
    assert result.exit_code == 0, result.output
    assert "express worker: 1 process(es) beside each class" in report.read_text()
    bad = CliRunner().invoke(main, ["replay", str(trace), "--policy", str(policy),
                                    "--express", "-1"])
    assert bad.exit_code == 2 and "--express" in bad.output


def test_a_warm_up_is_simulated_but_not_counted(tmp_path):
    trace, policy = trace_and_policy(tmp_path)  # 40 runs, one every 0.1 s
    result = CliRunner().invoke(main, ["replay", str(trace), "--policy", str(policy),
                                       "--count-from-s", "1.95", "--report",
                                       str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert "│ all            │ 20 " in result.output  # runs 20..39 count
    assert "warm-up: the first 2s (20 runs) simulated, not counted" in (
        tmp_path / "r.html").read_text()


@pytest.mark.parametrize("args, message", [
    (["--workers", "cpu=none"], "--workers: 'cpu=none' is not CLASS=SLOTS"),
    (["--consumption", "no_such"], "--consumption: 'no_such'"),
    (["--overhead-ms", "-1"], "--overhead-ms"),
    (["--count-from-s", "100"], "--count-from-s: must be >= 0 and within the trace (4s)"),
])
def test_offline_replay_bad_options_name_the_problem(tmp_path, args, message):
    trace, policy = trace_and_policy(tmp_path)
    result = CliRunner().invoke(main, ["replay", str(trace), "--policy", str(policy), *args])
    assert result.exit_code == 2 and message in result.output


def test_offline_replay_needs_records_and_a_valid_policy(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("garbage\n")
    policy = tmp_path / "p.yaml"
    policy.write_text(yaml.safe_dump(TEST_POLICY))
    result = CliRunner().invoke(main, ["replay", str(empty), "--policy", str(policy)])
    assert result.exit_code == 2 and "no replayable records (skipped 1 record(s)" in result.output
    policy.write_text("tiers: []\n")
    trace = write_trace(tmp_path / "trace.jsonl")
    result = CliRunner().invoke(main, ["replay", str(trace), "--policy", str(policy)])
    assert result.exit_code == 2 and "tiers" in result.output


def test_app_replay_reads_the_stores_observations(app, store, tmp_path):
    path = write_trace(tmp_path / "trace.jsonl")
    records = [json.loads(line) for line in path.read_text().splitlines()]
    store.append_records(store.keys.observations, records, 1000)
    report = tmp_path / "r.html"
    result = CliRunner().invoke(aitp, ["replay", "--workers", "cpu=2,gpu=1", "--report",
                                       str(report)], obj=SimpleNamespace(app=app))
    assert result.exit_code == 0, result.output
    assert "the store's observations: 40 runs" in result.output and report.exists()
    assert "│ aitp " in result.output  # the app's own pipeline, named aitp
