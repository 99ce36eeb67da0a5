"""Run the dashboard with uvicorn (blocking, or in a background thread for the demo)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

from celery_aitp import __version__
from celery_aitp.dashboard.app import build_dashboard, create_app
from celery_aitp.dashboard.config import DashboardConfig


def make_server(middleware: Any, config: DashboardConfig, log_level: str = "warning") -> Any:
    """A uvicorn Server for the app of ``middleware``; the caller runs it.

    Refuses (PolicyError) a non-loopback address without authentication, whoever calls.
    """
    config.check_exposure()
    dashboard = build_dashboard(middleware, config, version=__version__)
    app = create_app(dashboard)
    uv_config = uvicorn.Config(app, host=config.address, port=config.port, log_level=log_level,
                               access_log=False, proxy_headers=False, lifespan="off")
    server = uvicorn.Server(uv_config)
    dashboard.fleet.warm()  # the first snapshot is built while the server starts
    server.dashboard = dashboard  # type: ignore[attr-defined]
    return server


def serve(middleware: Any, config: DashboardConfig) -> None:
    """Serve until interrupted (Ctrl-C or SIGTERM)."""
    server = make_server(middleware, config, log_level="info")
    try:
        server.run()
    finally:
        server.dashboard.fleet.close()


class BackgroundServer:
    """The dashboard in a daemon thread on an already bound socket (demo, tests)."""

    def __init__(self, middleware: Any, config: DashboardConfig) -> None:
        self.sock = socket.socket(socket.AF_INET6 if ":" in config.address else socket.AF_INET)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((config.address, config.port))
        self.port = self.sock.getsockname()[1]
        self.server = make_server(middleware, config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="aitp-dashboard", daemon=True)

    def start(self, timeout_s: float = 10.0) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("dashboard did not start")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)
        self.server.dashboard.fleet.close()
        self.sock.close()
