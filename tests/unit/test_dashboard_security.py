"""Dashboard security audit: constant-time auth, CSRF on every write, reads never write,
loopback by default (the config, the server and the command all refuse a public address
without authentication), only the Host names it knows (DNS rebinding).
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
from starlette.testclient import TestClient

import celery_aitp
from celery_aitp.cli.celery_command import aitp
from celery_aitp.dashboard import security
from celery_aitp.dashboard.app import routes as route_table
from celery_aitp.dashboard.config import DashboardConfig, resolve_config
from celery_aitp.errors import PolicyError
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


#: A page the attacker serves, whose name then resolves to 127.0.0.1 (DNS rebinding): for
#: the browser it stays same-origin with itself, so it reads the answers and sends its own
#: Origin and Sec-Fetch-Site: same-origin.
REBOUND = "http://attacker.example:18520"


def test_a_dns_rebinding_page_can_neither_read_the_dashboard_nor_change_the_stage(
        store: RedisStore) -> None:
    client, dashboard = make_client(store, MemoryQueueOps(), allowed_hosts=())  # defaults
    rebound = TestClient(client.app, base_url=REBOUND)
    page = rebound.get("/stage")
    assert page.status_code == 403
    assert "attacker.example" in page.text and "--allowed-hosts" in page.text  # says why
    assert "aitp_csrf" not in page.headers.get("set-cookie", "")  # no token handed out
    assert "x-frame-options" in page.headers  # the security headers still go out
    # even with a token and cookie from somewhere else, the change is refused
    token = TestClient(client.app, base_url="http://127.0.0.1:18520").get(
        "/stage").cookies["aitp_csrf"]
    post = rebound.post("/api/stage", json={"stage": "coexistence"}, headers={
        "Origin": REBOUND, "Sec-Fetch-Site": "same-origin", "X-AITP-CSRF": token,
        "Cookie": f"aitp_csrf={token}"})
    assert post.status_code == 403, post.text
    assert store.read_stage() is None and store.stage_history(5) == []
    # and no read answers either: pages, API, metrics, probes, static files
    for path in ("/", "/tasks/id-1", "/api", "/api/overview", "/api/queues", "/api/stage",
                 "/api/tasks/id-1", "/metrics", "/healthz", "/healthcheck", "/readyz",
                 "/static/dashboard.js", "/nowhere"):
        assert rebound.get(path).status_code == 403, path
    assert client.get("/healthz", headers={"Host": ""}).status_code == 403  # none at all


@pytest.mark.parametrize("host", ["localhost", "localhost:18520", "LocalHost.:5566",
                                  "127.0.0.1", "127.0.0.1:18520", "[::1]", "[::1]:5566"])
def test_the_loopback_names_are_answered_on_any_port(store: RedisStore, host: str) -> None:
    client, _ = make_client(store, MemoryQueueOps(), allowed_hosts=())
    assert client.get("/api/overview", headers={"Host": host}).status_code == 200


@pytest.mark.parametrize("host", ["attacker.example", "localhost.attacker.example",
                                  "127.0.0.1.attacker.example", "::1", "[::1", "[::1]x",
                                  "localhost:http", "localhost:99999999", "[localhost]"])
def test_other_and_malformed_host_names_are_refused(store: RedisStore, host: str) -> None:
    client, _ = make_client(store, MemoryQueueOps(), allowed_hosts=())
    assert client.get("/api/overview", headers={"Host": host}).status_code == 403


def test_the_bound_address_and_the_allowed_names_are_answered(store: RedisStore) -> None:
    auth = {"Authorization": basic("ann", "pw")}
    client, _ = make_client(store, MemoryQueueOps(), address="192.0.2.7",
                            basic_auth=(("ann", "pw"),), allowed_hosts=("ops.example.org",))
    for host, status in (("192.0.2.7:5566", 200), ("ops.example.org", 200),
                         ("OPS.Example.org:443", 200), ("localhost:5566", 200),
                         ("192.0.2.8", 403), ("attacker.example", 403),
                         ("ops.example.org.attacker.example", 403)):
        assert client.get("/api/overview", headers={**auth, "Host": host}).status_code \
            == status, host
    public = TestClient(client.app, base_url="https://ops.example.org")
    token = public.get("/stage", headers=auth).cookies["aitp_csrf"]
    changed = public.post("/api/stage", json={"stage": "coexistence"}, headers={
        **auth, "Origin": "https://ops.example.org", "X-AITP-CSRF": token,
        "Cookie": f"aitp_csrf={token}"})
    assert changed.status_code == 200, changed.text
    anyone, _ = make_client(store, MemoryQueueOps(), basic_auth=(("ann", "pw"),),
                            allowed_hosts=("*",))
    assert anyone.get("/api/overview", headers={**auth, "Host": "x.example"}).status_code \
        == 200


def test_any_host_name_without_authentication_is_refused_everywhere() -> None:
    with pytest.raises(PolicyError, match="DNS rebinding"):
        resolve_config({}, allowed_hosts="*").check_exposure()
    resolve_config({}, allowed_hosts="*", basic_auth=("ann:pw",)).check_exposure()
    app = Celery("sec", broker="memory://")
    celery_aitp.install(app, policy=TEST_POLICY, store_url="redis://127.0.0.1:1/0")
    result = CliRunner().invoke(aitp, ["dashboard"], obj=SimpleNamespace(app=app),
                                env={"AITP_DASHBOARD_ALLOWED_HOSTS": "ops.example.org,*"})
    assert result.exit_code == 2 and "--allowed-hosts '*'" in result.output
