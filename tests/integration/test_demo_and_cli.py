"""The README's demo command and the ``celery -A proj aitp ...`` entry point, as users run them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.workers import ROOT

pytestmark = [pytest.mark.slow]

CELERY = [sys.executable, "-m", "celery"]


def _group_is_empty(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_demo_runs_on_the_embedded_broker_and_leaves_no_process_behind():
    env = {k: v for k, v in os.environ.items() if not k.startswith("AITP_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery_aitp", "demo", "--tour", "--tasks", "80"],
        env=env, cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    assert "where tasks ran" in text and "broker: embedded Redis" in text
    assert "80 tasks:" in text and "80 runs recorded" in text
    deadline = time.monotonic() + 10
    while not _group_is_empty(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _group_is_empty(proc.pid), "the demo left processes behind"


def test_demo_compare_prints_plain_celery_and_celery_aitp_side_by_side_and_loses_nothing():
    env = {k: v for k, v in os.environ.items() if not k.startswith("AITP_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery_aitp", "demo", "--seconds", "6"],
        env=env, cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    published = re.search(r"workload: (\d+) undeclared tasks", text)
    assert published, text[-3000:]
    n = int(published.group(1))
    assert "run 1: plain Celery" in text and "run 2: celery_aitp" in text
    header = next(line for line in text.splitlines() if "plain Celery" in line and "ratio" in line)
    assert header.index("plain Celery") < header.index("celery_aitp")
    for row in ("short tasks' wait p50 (ms)", "short tasks' wait p95 (ms)",
                "mean bounded slowdown", "long tasks' longest wait (s)"):
        line = next(line for line in text.splitlines() if row in line)
        assert len(re.findall(r"\d+(?:\.\d+)?", line.split(row)[1])) >= 2, line
    lost = next(line for line in text.splitlines() if "tasks (lost)" in line)
    assert lost.count(f"{n} (0)") == 2, lost  # every task ran, in both runs
    deadline = time.monotonic() + 10
    while not _group_is_empty(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _group_is_empty(proc.pid), "the demo left processes behind"


@pytest.mark.redis
def test_celery_aitp_subcommands_are_reachable_through_celery(proj, deployment, tmp_path: Path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    bad = tmp_path / "bad.yaml"
    bad.write_text("tiers: []\ntenants: {acme: {weight: -1}}\n")
    validate = subprocess.run([*CELERY, "-A", "tests.apps.proj", "aitp", "validate", str(bad)],
                              env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert validate.returncode == 1
    assert "invalid: tiers:" in validate.stderr and "tenants.acme.weight" in validate.stderr

    proj.app.aitp.store.advertise("w1@test", ["aitp.acme.cpu.hi"], {"tenants": ["acme"]}, 60)
    status = subprocess.run([*CELERY, "-A", "tests.apps.proj", "aitp", "status", "--json"],
                            env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert '"aitp.acme.cpu.hi"' in status.stdout and '"worker": "w1@test"' in status.stdout
