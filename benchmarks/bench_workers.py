"""Worker processes of the scheduling benchmark, started and stopped by their own pid."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class BenchWorker:
    """One ``celery worker`` of a benchmark app (threads pool: the tasks sleep)."""

    def __init__(self, name: str, slots: int, flags: list[str], env: dict[str, str],
                 app: str = "benchmarks.sched_app") -> None:
        self.name = name
        fd, log = tempfile.mkstemp(prefix=f"aitp-bench-{name}-", suffix=".log")
        os.close(fd)
        self.log = Path(log)
        self.cmd = [sys.executable, "-m", "celery", "-A", app, "worker",
                    "-n", f"{name}@%h", "-P", "threads", "-c", str(slots), "--loglevel", "INFO",
                    "--without-gossip", "--without-mingle", "--without-heartbeat", *flags]
        self.env = dict(os.environ, **env, PYTHONPATH=str(ROOT))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=out, stderr=out,
                                         cwd=str(ROOT), start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if " ready." in self.output():
                return
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited:\n{self.output()[-3000:]}")
            time.sleep(0.1)
        raise RuntimeError(f"worker {self.name} not ready in {timeout_s}s:\n"
                           f"{self.output()[-3000:]}")

    def stop(self, timeout_s: float = 30.0) -> None:
        """Warm shutdown (running tasks finish); SIGKILL the group if it hangs."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        self.log.unlink(missing_ok=True)


@contextlib.contextmanager
def running(workers: list[BenchWorker]) -> Iterator[list[BenchWorker]]:
    """Start every worker, wait until all are ready, stop them all on exit."""
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.wait_ready()
        yield workers
    finally:
        for worker in workers:
            worker.stop()
