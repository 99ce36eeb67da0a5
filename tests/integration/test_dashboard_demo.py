"""A newcomer's path: the demo with ``--dashboard`` shows tasks moving through tiers live."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import httpx2 as httpx
import pytest

from tests.support.workers import ROOT

pytestmark = [pytest.mark.slow]


def overview(url: str) -> dict:
    return httpx.get(url + "/api/overview", timeout=10).json()


def test_demo_serves_a_live_dashboard_and_stops_cleanly_on_sigterm():
    env = {k: v for k, v in os.environ.items() if not k.startswith("AITP_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery_aitp", "demo", "--tasks", "30", "--dashboard", "0"],
        env=dict(env, COLUMNS="200"), cwd=str(ROOT), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")),
                              daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 90
        while not any("steady trickle" in line for line in lines):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
            time.sleep(0.2)
        url = re.search(r"dashboard: (http://127\.0\.0\.1:\d+)/", "".join(lines)).group(1)
        # counters reach the store on each process's next refresh round: wait for the
        # demo's first tasks to show, then check that the trickle keeps them moving
        first = overview(url)
        while first["decisions"]["total"]["total"] < 30:
            assert time.monotonic() < deadline, first
            time.sleep(0.3)
            first = overview(url)
        # the trickle keeps publishing: later reads show the counters moving (a page may
        # be answered from the previous snapshot while the next one is built, so the
        # first read after a pause can show what the one before it showed)
        second = overview(url)
        while second["decisions"]["total"]["total"] <= first["decisions"]["total"]["total"]:
            assert time.monotonic() < deadline, (first, second)
            time.sleep(0.5)
            second = overview(url)
        assert second["decisions"]["total"]["total"] > first["decisions"]["total"]["total"] >= 30
        assert second["decisions"]["total"]["routed"] > 0 and second["workers"]["alive"] == 2
        assert second["stage"]["stage"] == "takeover"
        served = [q for q in httpx.get(url + "/api/queues", timeout=10).json()["queues"]
                  if q["consumers"]]
        assert {q["tier"] for q in served} == {"hi", "mid", "lo"}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, "".join(lines)[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the demo left processes behind")
