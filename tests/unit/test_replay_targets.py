"""Issue 17's replay targets: slots sized to a load, short/long by true runtime, a bounded
slowdown of any floor, the cold-start run and a model trained on the trace's first part."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from celery_aitp.cli.standalone import main
from celery_aitp.replay.metrics import (
    GroupStats,
    RunStats,
    bounded_slowdown,
    cold_start_target,
    run_stats,
    short_mask,
    size_targets,
)
from celery_aitp.replay.runner import offered_load, slots_for_load
from celery_aitp.replay.trace import from_records, write_jsonl


def rec(at: float, runtime: float, accelerator: str = "cpu", **extra):
    return {"task": "job", "tenant": None, "published_at": 1000.0 + at, "runtime_s": runtime,
            "accelerator": accelerator, **extra}


def test_slots_are_sized_so_the_offered_load_is_the_one_asked_for():
    # 100 s of trace; cpu work 850 s, gpu work 42.5 s
    records = [rec(i, 8.5) for i in range(100)] + [rec(i * 20, 8.5, "gpu") for i in range(5)]
    records.append(rec(100, 0.0))
    trace = from_records(records)
    slots = slots_for_load(trace, 0.85)
    assert slots == {"cpu": 10, "gpu": 1}  # never less than one slot
    assert offered_load(trace, slots)["cpu"] == pytest.approx(0.85)
    with pytest.raises(ValueError, match="--load"):
        slots_for_load(trace, 1.5)
    at_once = from_records([rec(0.0, 8.5) for _ in range(20)])  # no rate to size by
    with pytest.raises(ValueError, match="give --workers"):
        slots_for_load(at_once, 0.85)


def test_short_tasks_are_the_fastest_80_percent_by_true_runtime():
    runtimes = [5.0, 1.0, 9.0, 1.0, 3.0, 7.0, 2.0, 8.0, 4.0, 6.0]
    short = short_mask(runtimes)
    assert sum(short) == 8
    assert [r for r, s in zip(runtimes, short, strict=True) if not s] == [9.0, 8.0]


def test_the_slowdown_bound_is_the_runtime_floor():
    import numpy as np

    wait, runtime = np.array([10.0, 10.0]), np.array([1.0, 20.0])
    assert bounded_slowdown(wait, runtime, 10.0).tolist() == [1.1, 1.5]
    assert bounded_slowdown(wait, runtime).tolist() == [11.0, 1.5]  # default 0.1 s


def test_run_stats_group_short_and_long_tasks():
    stats = run_stats("r", [0.0, 4.0, 100.0], [1.0, 1.0, 50.0], ["lo"] * 3, ["a"] * 3, {},
                      short=[True, True, False])
    short, long = stats.group("size", "short"), stats.group("size", "long")
    assert short is not None and short.tasks == 2 and short.wait_max_s == 4.0
    assert long is not None and long.tasks == 1 and long.wait_max_s == 100.0


def _stats(name: str, slowdown: float, short_p95: float, long_max: float) -> RunStats:
    def group(kind: str, label: str, p95: float, most: float) -> GroupStats:
        return GroupStats(kind, label, 10, 0.0, p95, most, slowdown, None)

    return RunStats(name, [group("size", "short", short_p95, short_p95),
                           group("size", "long", long_max, long_max),
                           group("all", "all", short_p95, long_max)])


def test_size_targets_and_cold_start_compare_with_fifo_and_the_oracle():
    fifo, oracle = _stats("fifo", 10.0, 100.0, 1000.0), _stats("oracle", 4.0, 10.0, 1500.0)
    policy = _stats("p", 4.6, 25.0, 2100.0)
    found = {t.name: (round(t.value, 3), t.limit, t.met)
             for t in size_targets(fifo, policy, oracle)}
    assert found == {"mean slowdown / FIFO's": (0.46, 0.5, True),
                     "mean slowdown / oracle's": (1.15, 1.2, True),
                     "short tasks' p95 wait / FIFO's": (0.25, 0.3, True),
                     "long tasks' longest wait / FIFO's": (2.1, 2.0, False)}
    assert not cold_start_target(fifo, _stats("cold", 10.5, 1, 1)).met
    assert cold_start_target(fifo, _stats("cold", 10.0, 1, 1)).met


def test_a_run_whose_tasks_were_all_lost_gets_no_targets():
    fifo, oracle = _stats("fifo", 10.0, 100.0, 1000.0), _stats("oracle", 4.0, 10.0, 1500.0)
    lost = run_stats("p", [], [], [], [], {}, lost=200)  # no worker for their class
    assert size_targets(fifo, lost, oracle) == []  # it raised AssertionError
    assert cold_start_target(fifo, lost) is None


def test_a_wait_of_the_simulated_clocks_rounding_is_no_wait():
    """An express run's 1e-7 s 'waits' against FIFO's zeros made every ratio inf."""
    stats = run_stats("r", [9.35e-08, 0.0, 2.0], [1.0, 1.0, 1.0], ["hi"] * 3, ["a"] * 3, {})
    assert stats.overall.wait_p50_s == 0.0 and stats.overall.wait_max_s == 2.0


def _batch_trace(path: Path, n: int = 400) -> Path:
    """A small batch-like trace: 80% short jobs, 20% long ones, the runtime told by an
    argument (as a requested time would), one job every 10 s."""
    rng = random.Random(3)
    records = []
    for i in range(n):
        long = rng.random() < 0.2
        runtime = rng.uniform(200, 400) if long else rng.uniform(5, 20)
        records.append({"task": "job", "task_id": f"j{i}", "tenant": f"u{i % 3}",
                        "args": [], "kwargs": {"requested_s": 500 if long else 30},
                        "published_at": 1000.0 + 10 * i, "runtime_s": runtime})
    write_jsonl(records, path)
    return path


def test_replay_with_a_model_trained_on_the_first_part_and_a_cold_start(tmp_path):
    trace = _batch_trace(tmp_path / "trace.jsonl")
    result = CliRunner().invoke(main, [
        "replay", str(trace), "--load", "0.85", "--slowdown-bound-s", "10",
        "--train-share", "0.5", "--refresh-s", "30", "--report", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "trained on the first 200 runs" in out
    for run in ("aitp", "cold", "fifo", "oracle"):
        assert f"│ {run} " in out
    assert re.search(r"size short\s*│ 160 ", out) and re.search(r"size long\s*│ 40 ", out)
    for name in ("mean slowdown / FIFO's", "short tasks' p95 wait / FIFO's",
                 "long tasks' longest wait / FIFO's", "cold start mean slowdown / FIFO's"):
        assert name in out
    page = (tmp_path / "r.html").read_text()
    assert "offered load cpu" in page and "runtimes below 10s count as 10s" in page


def test_the_trainer_retrains_during_the_replay(tmp_path):
    """No model to start with: the simulated trainer learns one from the replayed runs and
    the policy's later tasks are predicted by it; the cold start and the oracle get none."""
    trace = _batch_trace(tmp_path / "trace.jsonl")
    result = CliRunner().invoke(main, [
        "replay", str(trace), "--load", "0.85", "--slowdown-bound-s", "10", "--cold-start",
        "--trainer-every", "10m", "--refresh-s", "30", "--report", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    promoted = re.search(r"models promoted: aitp (\d+)", out)
    assert promoted and int(promoted.group(1)) >= 1, out
    page = (tmp_path / "r.html").read_text()
    used = re.search(r"aitp decisions: [^;]*; predicted by: ([^<]*)", page)
    assert used and re.search(r"model \d+", used.group(1)), page
    cold = re.search(r"cold decisions: [^;]*; predicted by: ([^<]*)", page)
    assert cold and "model" not in cold.group(1), page


@pytest.mark.parametrize("args, message", [
    (["--workers", "cpu=2", "--trainer-every", "soon"],
     "--trainer-every: 'soon': expected a positive duration"),
    (["--load", "0.85", "--workers", "cpu=2"], "--workers and --load"),
    (["--load", "1.2"], "--load: must be between 0 and 1"),
    (["--train-share", "0.5", "--model", "somewhere"], "--model and --train-share"),
])
def test_bad_sizing_options_are_clear_errors(tmp_path, args, message):
    trace = _batch_trace(tmp_path / "trace.jsonl", 40)
    result = CliRunner().invoke(main, ["replay", str(trace), *args,
                                       "--report", str(tmp_path / "r.html")])
    assert result.exit_code != 0 and message in result.output


def test_replay_with_workers_for_no_class_of_the_trace_says_so(tmp_path):
    trace = tmp_path / "cpu.jsonl"
    write_jsonl([rec(float(i), 0.5) for i in range(50)], trace)
    out = CliRunner().invoke(main, ["replay", str(trace), "--workers", "gpu=2",
                                    "--report", str(tmp_path / "r.html")])
    assert out.exit_code == 0, out.output
    assert "was lost" in out.output and "nothing to compare" in out.output


def test_replay_refuses_a_missing_report_directory_before_it_runs(tmp_path):
    trace = tmp_path / "cpu.jsonl"
    write_jsonl([rec(float(i), 0.5) for i in range(50)], trace)
    out = CliRunner().invoke(main, ["replay", str(trace), "--workers", "cpu=2",
                                    "--report", str(tmp_path / "no" / "r.html")])
    assert out.exit_code == 2 and "is not a directory" in out.output
    assert "mean slowdown" not in out.output  # refused before the simulation


def test_replay_refuses_a_model_asked_for_that_does_not_load(tmp_path, trained):
    trace = tmp_path / "cpu.jsonl"
    write_jsonl([rec(float(i), 0.5) for i in range(50)], trace)
    model = Path(trained.bundle.save(tmp_path / "model"))
    text = (model / "p50.txt").read_text()
    (model / "p50.txt").write_text(text[: len(text) // 2])  # cut: 'end of trees' missing
    out = CliRunner().invoke(main, ["replay", str(trace), "--workers", "cpu=2", "--model",
                                    str(model), "--report", str(tmp_path / "r.html")])
    assert out.exit_code == 2 and "--model: p50 model" in out.output
