"""The dashboard behind a reverse proxy: forwarded headers from trusted proxies only, a
user header from an authenticating proxy, Flower's health probe and links to Flower."""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest
from starlette.testclient import TestClient

from celery_aitp.store import Keys, RedisStore
from celery_aitp.stubs import MemoryQueueOps
from tests.unit.test_dashboard_api import make_client, seed

PROXY = ("127.0.0.1", 40000)
ELSEWHERE = ("10.9.9.9", 40000)
SITE = "https://dash.example"
TLS = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9"}


@pytest.fixture
def store() -> RedisStore:
    return RedisStore(fakeredis.FakeRedis(), Keys("proxy"))


def behind(store: RedisStore, peer: tuple[str, int] = PROXY, **config: Any) -> TestClient:
    """A client reaching the dashboard as ``SITE``, connecting from ``peer``."""
    client, _ = make_client(store, MemoryQueueOps(), allowed_hosts=("dash.example",), **config)
    return TestClient(client.app, base_url="http://dash.example", client=peer)


def post_stage(client: TestClient, headers: dict[str, str], prefix: str = "",
               origin: str = SITE) -> Any:
    """Load the stage page, then post a change as its form does (the cookie is sent by
    hand: under TLS it is Secure, and the test client speaks plain http)."""
    token = client.get(prefix + "/stage", headers=headers).cookies["aitp_csrf"]
    return client.post(prefix + "/api/stage", json={"stage": "coexistence"}, headers={
        **headers, "X-AITP-CSRF": token, "Origin": origin, "Cookie": f"aitp_csrf={token}"})


def test_a_tls_proxy_needs_proxy_headers_for_stage_changes(store):
    refused = post_stage(behind(store), TLS)
    assert refused.status_code == 403
    assert "--proxy-headers" in refused.json()["error"]  # the message names the fix
    assert store.read_stage() is None
    accepted = post_stage(behind(store, proxy_headers=True), TLS)
    assert accepted.status_code == 200, accepted.text
    # the audit names the browser's address, as the proxy forwarded it
    assert store.stage_history(1)[0]["who"] == "dashboard:anonymous@203.0.113.9"


def test_forwarded_headers_count_only_from_the_allowed_addresses(store):
    untrusted = behind(store, ELSEWHERE, proxy_headers=True)
    assert post_stage(untrusted, TLS).status_code == 403
    network = behind(store, ELSEWHERE, proxy_headers=True, forwarded_allow_ips=("10.0.0.0/8",))
    assert post_stage(network, TLS).status_code == 200


def test_links_and_cookies_follow_the_forwarded_scheme_under_a_prefix(store):
    plain = behind(store, url_prefix="/ops/aitp")
    assert plain.get("/ops/aitp", headers=TLS, follow_redirects=False).headers["location"] \
        == "http://dash.example/ops/aitp/"  # what broke behind TLS before
    proxied = behind(store, url_prefix="/ops/aitp", proxy_headers=True)
    assert proxied.get("/ops/aitp", headers=TLS, follow_redirects=False).headers["location"] \
        == "https://dash.example/ops/aitp/"
    cookie = proxied.get("/ops/aitp/stage", headers=TLS).headers["set-cookie"]
    assert "Secure" in cookie and "Path=/ops/aitp" in cookie
    assert "Secure" not in plain.get("/ops/aitp/stage", headers=TLS).headers["set-cookie"]
    assert post_stage(proxied, TLS, prefix="/ops/aitp").status_code == 200


def test_the_proxy_user_header_is_believed_from_trusted_peers_only(store):
    options = {"auth_header": "x-forwarded-user", "proxy_headers": True}
    proxied = behind(store, **options)
    assert proxied.get("/api/overview").status_code == 401  # no user named
    refused = proxied.get("/api/overview")
    assert "www-authenticate" not in refused.headers  # no password prompt to show
    assert proxied.get("/api/overview", headers={"X-Forwarded-User": "alice"}).status_code == 200
    assert post_stage(proxied, {**TLS, "X-Forwarded-User": "alice"}).status_code == 200
    assert store.stage_history(1)[0]["who"] == "dashboard:alice@203.0.113.9"
    forged = behind(store, ELSEWHERE, **options)
    assert forged.get("/api/overview", headers={"X-Forwarded-User": "alice"}).status_code == 401
    for bad in ("", "   ", "eve\x1b[2J"):
        assert proxied.get("/api/overview", headers={"X-Forwarded-User": bad}).status_code \
            == 401, repr(bad)
    for path in ("/healthz", "/readyz", "/healthcheck"):  # probes stay open
        assert forged.get(path).status_code == 200, path


def test_basic_auth_still_works_beside_the_proxy_header(store):
    import base64

    both = behind(store, ELSEWHERE, auth_header="x-forwarded-user",
                  basic_auth=(("ops", "pw"),))
    basic = {"Authorization": "Basic " + base64.b64encode(b"ops:pw").decode()}
    refused = both.get("/api/overview", headers={"X-Forwarded-User": "alice"})
    assert refused.status_code == 401 and "Basic" in refused.headers["www-authenticate"]
    assert both.get("/api/overview", headers=basic).status_code == 200
    changed = post_stage(both, {**basic, "X-Forwarded-User": "alice"},
                         origin="http://dash.example")
    assert changed.status_code == 200, changed.text  # as ops: the header is not believed
    assert store.stage_history(1)[0]["who"].startswith("dashboard:ops@")


def test_healthcheck_answers_as_flower_does(store):
    response = behind(store, basic_auth=(("ops", "pw"),)).get("/healthcheck")
    assert response.status_code == 200 and response.text == "OK"
    assert response.headers["content-type"].startswith("text/plain")


def test_flower_links_on_worker_rows_and_the_task_page(store):
    ops = MemoryQueueOps()
    seed(store, ops)
    client, _ = make_client(store, ops, flower_url="https://flower.example/fl")
    worker = client.get("/api/workers").json()["workers"][0]
    assert worker["flower_url"] == "https://flower.example/fl/worker/gpu1@host"
    task = client.get("/api/tasks/id-1").json()
    assert task["flower_url"] == "https://flower.example/fl/task/id-1"
    assert 'id="flower-link"' in client.get("/tasks/id-1").text
    without, _ = make_client(store, ops)
    assert without.get("/api/workers").json()["workers"][0]["flower_url"] is None
    assert without.get("/api/tasks/id-1").json()["flower_url"] is None


def test_the_command_takes_the_proxy_options_and_refuses_an_open_user_header():
    from types import SimpleNamespace

    from celery import Celery
    from click.testing import CliRunner

    import celery_aitp
    from celery_aitp.cli.celery_command import aitp
    from tests.conftest import TEST_POLICY

    app = Celery("proxy", broker="memory://")
    celery_aitp.install(app, policy=TEST_POLICY, store_url="redis://127.0.0.1:1/0")
    result = CliRunner().invoke(aitp, ["dashboard", "--auth-header", "X-Forwarded-User",
                                       "--forwarded-allow-ips", "*"],
                                obj=SimpleNamespace(app=app))
    assert result.exit_code == 2 and "any client could name itself" in result.output
    result = CliRunner().invoke(aitp, ["dashboard", "--flower-url", "flower"],
                                obj=SimpleNamespace(app=app))
    assert result.exit_code == 2 and "--flower-url" in result.output
    assert "--proxy-headers" in CliRunner().invoke(aitp, ["dashboard", "--help"],
                                                   obj=SimpleNamespace(app=app)).output
