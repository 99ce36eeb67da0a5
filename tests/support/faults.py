"""Tools of the fault suite: a private Redis server, a load generator and a ledger.

The ledger counts, for one scenario, tasks published (accepted by ``apply_async``),
refused (``apply_async`` raised: the caller knows, nothing was accepted), completed
(distinct task ids whose run finished), duplicated (finished runs beyond the first) and
lost (accepted, never finished). Every scenario's row goes into ``RESULTS``; the test
session prints them as a table at the end (``tests/conftest.py``).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from celery_aitp.demo.embedded import redis_server_binary


@dataclass
class FaultResult:
    scenario: str
    broker: str
    published: int
    refused: int
    completed: int
    duplicated: int
    lost: int
    notes: str = ""


#: Rows of the fault table, in the order the scenarios ran.
RESULTS: list[FaultResult] = []


def format_table(rows: list[FaultResult]) -> str:
    header = ("scenario", "broker", "published", "refused", "completed", "duplicated", "lost",
              "notes")
    lines = [header] + [(r.scenario, r.broker, str(r.published), str(r.refused),
                         str(r.completed), str(r.duplicated), str(r.lost), r.notes)
                        for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = [" | ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
           for line in lines]
    out.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(out)


def free_port(preferred: int) -> int:
    """``preferred`` if nothing listens there, else a port the system picks."""
    for port in (preferred, 0):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(probe.getsockname()[1])
    raise RuntimeError("no free port")


class PrivateRedis:
    """A redis-server of our own (on ``preferred_port`` if free), with an append-only file
    so a restart keeps what it held, like a production broker (unless not ``durable``);
    stopped by its pid."""

    def __init__(self, preferred_port: int, durable: bool = True) -> None:
        self.port = free_port(preferred_port)
        self.durable = durable
        self.directory = Path(tempfile.mkdtemp(prefix="aitp-fault-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> PrivateRedis:
        args = [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--dir", str(self.directory), "--loglevel", "warning",
                *(("--appendonly", "yes", "--appendfsync", "always") if self.durable
                  else ("--appendonly", "no"))]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server on port {self.port} exited at start")
            try:
                if redis.Redis(port=self.port, socket_timeout=0.5).ping():
                    return self
            except redis.RedisError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def stop(self) -> None:
        """SIGTERM (redis flushes its append-only file) and wait."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self, down_s: float = 0.0) -> float:
        """Stop, stay down ``down_s``, start on the same port and data; the downtime in s."""
        began = time.monotonic()
        self.stop()
        time.sleep(down_s)
        self.start()
        return time.monotonic() - began

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    def holding(self, task_ids: list[str]) -> set[str]:
        """Which of ``task_ids`` a list or hash of this server still holds: a queue, or
        kombu's unacknowledged messages (a stranded task, not a lost one)."""
        client = redis.Redis(port=self.port, socket_timeout=5)
        held: set[str] = set()
        for key in client.scan_iter():
            kind = client.type(key)
            values = (client.lrange(key, 0, -1) if kind == b"list"
                      else client.hvals(key) if kind == b"hash" else [])
            blob = b"\n".join(values)
            held.update(t for t in task_ids if t.encode() in blob)
        client.close()
        return held


@dataclass
class Ledger:
    """What one scenario published, and what its workers report as finished.

    ``entries()`` returns one ``<task id>|<worker>|<unix time>`` string per finished run.
    """

    entries: Callable[[], list[str]]
    published: list[str] = field(default_factory=list)
    published_at: dict[str, float] = field(default_factory=dict)  # unix time
    refused: int = 0
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def publish(self, send: Callable[[], Any]) -> None:
        """Call ``send()`` (an apply_async); record the id or the refusal."""
        try:
            result = send()
        except Exception as exc:  # the caller sees Celery's own publish error
            with self.lock:
                self.refused += 1
                self.errors.append(f"{type(exc).__name__}: {exc}")
            return
        with self.lock:
            self.published.append(result.id)
            self.published_at[result.id] = time.time()

    def runs(self) -> list[str]:
        """Task id of every finished run (repeats are duplicates)."""
        return [entry.split("|", 1)[0] for entry in self.entries()]

    def workers(self) -> Counter[str]:
        """Finished runs per worker (by the name given in the test)."""
        return Counter(entry.split("|")[1].split("@", 1)[0].rsplit("-", 1)[0]
                       for entry in self.entries())

    def finished_at(self, task_id: str) -> float | None:
        """When the last run of ``task_id`` finished (unix time), if it did."""
        times = [float(e.split("|")[2]) for e in self.entries() if e.startswith(task_id + "|")]
        return max(times) if times else None

    def pending(self) -> list[str]:
        """Accepted tasks not finished yet, oldest first."""
        done = set(self.runs())
        return [task_id for task_id in self.published if task_id not in done]

    def counts(self) -> tuple[int, int, int]:
        """(completed, duplicated, lost) as of now."""
        runs = Counter(self.runs())
        accepted = set(self.published)
        completed = len(accepted & set(runs))
        duplicated = sum(n - 1 for task_id, n in runs.items() if n > 1)
        return completed, duplicated, len(accepted) - completed

    def wait_complete(self, timeout_s: float) -> None:
        """Until every accepted task finished (or the timeout: the table shows the loss)."""
        deadline = time.monotonic() + timeout_s
        while self.counts()[2] and time.monotonic() < deadline:
            time.sleep(0.1)

    def settle(self, quiet_s: float, timeout_s: float = 60.0) -> None:
        """Wait for all, then until no run finished for ``quiet_s`` (late duplicates)."""
        self.wait_complete(timeout_s)
        seen, since = len(self.runs()), time.monotonic()
        while time.monotonic() - since < quiet_s:
            time.sleep(0.2)
            now = len(self.runs())
            if now != seen:
                seen, since = now, time.monotonic()

    def result(self, scenario: str, broker: str, notes: str = "") -> FaultResult:
        completed, duplicated, lost = self.counts()
        row = FaultResult(scenario, broker, len(self.published), self.refused, completed,
                          duplicated, lost, notes)
        RESULTS.append(row)
        return row


def publish_steadily(ledger: Ledger, send: Callable[[int], Any], n: int,
                     rate_per_s: float) -> threading.Thread:
    """Publish ``n`` tasks at ``rate_per_s`` from a background thread (a producer)."""

    def run() -> None:
        for i in range(n):
            ledger.publish(lambda i=i: send(i))
            time.sleep(1.0 / rate_per_s)

    thread = threading.Thread(target=run, name="fault-producer", daemon=True)
    thread.start()
    return thread
