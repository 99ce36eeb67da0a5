"""How long a replay of a large trace takes, end to end, as users run it.

    python benchmarks/replay_speed.py [--tasks 100000]

Writes a trace of ``--tasks`` observation records drawn from the scheduling benchmark's
workload (same tenants, task kinds and 90% load, over a longer period), then times
``celery-aitp replay TRACE --policy ... --workers cpu=6,gpu=2`` in a fresh process:
loading, the policy, FIFO and oracle simulations, the tables and the HTML report.
Target: under a minute for 100,000 tasks.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.workload import KINDS, POLICY, SLOTS, schedule  # noqa: E402
from celery_aitp.replay.trace import write_jsonl  # noqa: E402

TASKS_PER_SECOND = 37.8  # of the workload at 90% load


def make_trace(path: Path, tasks: int, seed: int) -> int:
    items = schedule(tasks / TASKS_PER_SECOND * 1.02, 0.9, seed)[:tasks]
    records = ({"task": i.task, "task_id": f"speed-{i.index}", "tenant": i.tenant,
                "accelerator": KINDS[i.task].accelerator, "tier": KINDS[i.task].tier,
                "args": [i.size], "kwargs": {}, "published_at": 1.7e9 + i.at,
                "runtime_s": i.runtime_s} for i in items)
    return write_jsonl(records, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="aitp-replay-speed-") as tmp:
        trace, policy = Path(tmp) / "trace.jsonl", Path(tmp) / "policy.json"
        policy.write_text(json.dumps(POLICY))
        n = make_trace(trace, args.tasks, args.seed)
        workers = ",".join(f"{a}={s}" for a, s in SLOTS.items())
        cmd = [sys.executable, "-m", "celery_aitp", "replay", str(trace), "--policy",
               str(policy), "--workers", workers, "--report", str(Path(tmp) / "report.html")]
        started = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        elapsed = time.perf_counter() - started
        size_kb = (Path(tmp) / "report.html").stat().st_size / 1024 if done.returncode == 0 else 0
    if done.returncode:
        print(done.stdout[-2000:], done.stderr[-2000:], sep="\n")
        return 1
    tail = [line for line in done.stdout.splitlines() if "target" in line]
    print("\n".join(tail))
    print(f"replayed {n:,} tasks (policy, FIFO, oracle) in {elapsed:.1f}s end to end "
          f"(target < 60s); report {size_kb:.0f} KiB")
    return 0 if elapsed < 60 else 1


if __name__ == "__main__":
    raise SystemExit(main())
