"""Dashboard security audit: constant-time auth, CSRF on every write, reads never write,
loopback by default (the config, the server and the command all refuse a public address
without authentication).
"""

from __future__ import annotations

import base64
from types import SimpleNamespace
from typing import Any

import fakeredis
import pytest
from celery import Celery
from click.testing import CliRunner
from starlette.routing import Mount, Route

import celery_aitp
from celery_aitp.cli.celery_command import aitp
from celery_aitp.dashboard import security
from celery_aitp.dashboard.app import routes as route_table
from celery_aitp.dashboard.config import DashboardConfig, resolve_config
from celery_aitp.store import Keys, RedisStore
from celery_aitp.stubs import MemoryQueueOps
from tests.conftest import TEST_POLICY
from tests.unit.test_dashboard_api import make_client, seed

CREDENTIALS = (("ann", "s3cret"), ("bob", "a-much-longer-password:with-colon"), ("cy", "x"))


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_auth_compares_equal_length_digests_of_every_pair(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    calls: list[tuple[int, int]] = []
    real = security.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(security.hmac, "compare_digest", spy)
    for user, password in [("ann", "s3cret"), ("ann", "s3cre"), ("nobody", "x" * 200),
                           ("cy", "x")]:
        calls.clear()
        security.check_basic_auth(basic(user, password), CREDENTIALS)
        # two comparisons per known pair, whether or not an earlier one matched
        assert calls == [(32, 32)] * (2 * len(CREDENTIALS)), (user, password)
    assert security.check_basic_auth(basic("ann", "s3cret"), CREDENTIALS) == "ann"
    assert security.check_basic_auth(basic("bob", CREDENTIALS[1][1]), CREDENTIALS) == "bob"
    assert security.check_basic_auth(basic("ann", "x"), CREDENTIALS) is None
    assert security.check_basic_auth(basic("cy", "s3cret"), CREDENTIALS) is None


def write_routes(table: Any, prefix: str = "") -> list[tuple[str, str]]:
    """(method, path) of every route that accepts anything but GET/HEAD."""
    found = []
    for route in table:
        if isinstance(route, Mount) and route.routes:
            found += write_routes(route.routes, prefix + route.path)
        elif isinstance(route, Route):
            found += [(m, prefix + route.path) for m in sorted(route.methods or ())
                      if m not in ("GET", "HEAD")]
    return found


@pytest.fixture
def store() -> RedisStore:
    return RedisStore(fakeredis.FakeRedis(), Keys("sec"))


def test_every_state_changing_route_refuses_cross_site_requests(store: RedisStore) -> None:
    client, dashboard = make_client(store, MemoryQueueOps())
    routes = write_routes(route_table(dashboard))
    assert routes == [("POST", "/api/stage")]  # a new write route must be added here
    client.get("/stage")
    token = client.cookies["aitp_csrf"]
    body = {"stage": "takeover"}
    for method, path in routes:
        for headers in ({"X-AITP-CSRF": token, "Origin": "http://evil.example"},
                        {"Origin": "http://testserver"},
                        {"X-AITP-CSRF": token, "Sec-Fetch-Site": "same-site"}):
            response = client.request(method, path, json=body, headers=headers)
            assert response.status_code == 403, (method, path, headers)
        ok = client.request(method, path, json=body,
                            headers={"X-AITP-CSRF": token, "Origin": "http://testserver"})
        assert ok.status_code == 200, ok.text
    assert store.stage_history(5)[0]["who"].startswith("dashboard:anonymous@")


def test_the_csrf_cookie_is_strict_and_unreadable_cross_site(store: RedisStore) -> None:
    client, _ = make_client(store, MemoryQueueOps())
    cookie = client.get("/stage").headers["set-cookie"].lower()
    assert "aitp_csrf=" in cookie and "samesite=strict" in cookie


def test_read_routes_never_write_the_store(store: RedisStore) -> None:
    ops = MemoryQueueOps()
    seed(store, ops)
    client, _ = make_client(store, ops)
    client.get("/")  # builds the first snapshot
    before = {k: store.client.dump(k) for k in sorted(store.client.keys("*"))}
    for path in ("/", "/tenants", "/queues", "/workers", "/predictions", "/tasks",
                 "/tasks/id-1", "/stage", "/api", "/api/overview", "/api/tenants",
                 "/api/queues", "/api/workers", "/api/predictions", "/api/tasks",
                 "/api/tasks/id-1", "/api/stage", "/metrics", "/healthz", "/readyz"):
        assert client.get(path).status_code in (200, 503), path
    after = {k: store.client.dump(k) for k in sorted(store.client.keys("*"))}
    assert after == before


def test_loopback_is_the_default_everywhere() -> None:
    assert DashboardConfig().address == "127.0.0.1"
    assert resolve_config({}).address == "127.0.0.1"
    app = Celery("sec", broker="memory://")
    celery_aitp.install(app, policy=TEST_POLICY, store_url="redis://127.0.0.1:1/0")
    runner = CliRunner()
    for args, env in ((["dashboard", "--address", "0.0.0.0"], {}),
                      (["dashboard"], {"AITP_DASHBOARD_ADDRESS": "::"})):
        result = runner.invoke(aitp, args, obj=SimpleNamespace(app=app), env=env)
        assert result.exit_code == 2 and "refusing to listen on a non-loopback" in result.output
