"""Real Celery worker processes for integration tests, stopped by their own pid."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


class WorkerProcess:
    """One ``celery worker`` of ``tests.apps.proj`` (or another app module)."""

    def __init__(self, name: str, args: list[str], env: dict[str, str],
                 app: str = "tests.apps.proj", pool: str = "prefork", concurrency: int = 1) -> None:
        self.name = name
        self.log = Path(tempfile.mkstemp(prefix=f"aitp-worker-{name}-", suffix=".log")[1])
        loglevel = os.environ.get("AITP_TEST_LOGLEVEL", "INFO")
        self.cmd = [sys.executable, "-m", "celery", "-A", app, "worker", "-n", f"{name}@%h",
                    "--pool", pool, "-c", str(concurrency), "--loglevel", loglevel,
                    "--without-gossip", "--without-mingle", "--without-heartbeat", *args]
        self.env = dict(os.environ, **env, PYTHONPATH=str(ROOT))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0) -> WorkerProcess:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=out, stderr=out,
                                         cwd=str(ROOT), start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if " ready." in self.output():
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited:\n{self.output()[-3000:]}")
            time.sleep(0.1)
        self.stop()
        tail = self.output()[-3000:]
        raise RuntimeError(f"worker {self.name} not ready in {timeout_s}s:\n{tail}")

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL the worker and its pool children (the process group it leads)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the worker's main process (e.g. SIGSTOP, SIGCONT)."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signum)

    def signal_group(self, signum: int) -> None:
        """Send ``signum`` to the worker and its pool children."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signum)

    def terminate(self) -> None:
        """Ask for a warm shutdown without waiting (see :meth:`wait_stopped`)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGCONT)  # a paused worker must hear it
            self.proc.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout_s: float = 15.0) -> None:
        """Wait for the exit; SIGKILL if it takes longer; reap pool children left behind."""
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def stop(self, timeout_s: float = 15.0) -> None:
        """Warm shutdown; SIGKILL if it does not exit in time."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.terminate()
        self.wait_stopped(timeout_s)

    def restart(self, timeout_s: float = 30.0) -> WorkerProcess:
        """Start the same worker again (after a kill or a stop), on a fresh log."""
        self.stop()
        self.log.unlink(missing_ok=True)
        return self.start(timeout_s)

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        self.log.unlink(missing_ok=True)


def stop_all(workers: list[WorkerProcess]) -> None:
    """Stop workers in parallel (a warm shutdown takes Celery 2-3 s each)."""
    for worker in workers:
        worker.terminate()
    for worker in workers:
        worker.wait_stopped()
        if not os.environ.get("AITP_TEST_KEEP_LOGS"):  # set it to read the logs afterwards
            worker.log.unlink(missing_ok=True)
