"""The real ``celery -A tests.apps.proj aitp dashboard`` command as a process, for the
integration tests that drive it over HTTP (directly or behind nginx)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tests.support.workers import ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), 0.5):
            return True
    except OSError:
        return False


def wait_for(predicate: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class DashboardCommand:
    """``celery aitp dashboard --port P <args>`` of the test app, stopped by its own pid.

    The test app reads its deployment from the environment (``tests/apps/proj.py``):
    set it before ``start``.
    """

    def __init__(self, args: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, "-m", "celery", "-A", "tests.apps.proj", "aitp",
                    "dashboard", "--port", str(self.port), *args]
        self.log = Path(tempfile.mkstemp(prefix="aitp-dashboard-", suffix=".log")[1])
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> DashboardCommand:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.cmd, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                                         cwd=str(ROOT), stdout=out, stderr=out,
                                         start_new_session=True)

        def up() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()
            return listening(self.port)

        wait_for(up, "the dashboard")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.log.unlink(missing_ok=True)
