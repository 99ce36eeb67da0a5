"""The dashboard behind a real reverse proxy: nginx terminating TLS (a self-signed
certificate made here) with oauth2-proxy-style authentication, in headless Chromium.

nginx (Debian's package) serves two TLS sites on loopback ports:

* the first asks a stand-in authentication service (``auth_request``, as oauth2-proxy is
  wired into nginx) and passes the user it names as ``X-Forwarded-User`` to the real
  ``celery aitp dashboard`` command, started with ``--url-prefix /aitp --proxy-headers
  --auth-header X-Forwarded-User --flower-url ...``;
* the second fronts a dashboard without ``--proxy-headers``: what the issue saw, stage
  changes refused because the browser's ``https://`` origin is not the ``http://`` one the
  dashboard believes it serves.

The browser signs in (a session cookie the auth service reads), changes the stage through
the form and follows the links to Flower; the store records who changed it.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import TEST_POLICY, _cleanup, environment
from tests.support.browser import browser_context
from tests.support.dashboard_process import DashboardCommand, free_port, listening, wait_for
from tests.support.programs import program

pytestmark = [pytest.mark.redis, pytest.mark.slow]

USER = "alice"
SESSION = "aitp_session"
FLOWER = "http://flower.test:5555/flower"
PREFIX = "/aitp"
WORKER = "gpu1@host"

NGINX_CONF = """
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 64; }}
http {{
  access_log {tmp}/access.log;
  client_body_temp_path {tmp}/body;
  proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fastcgi;
  uwsgi_temp_path {tmp}/uwsgi;
  scgi_temp_path {tmp}/scgi;

  # Stands in for oauth2-proxy: a signed-in browser carries a session cookie; the answer
  # names its user in X-Auth-Request-User.
  server {{
    listen 127.0.0.1:{auth_port};
    location / {{
      if ($cookie_{session} = "") {{ return 401; }}
      add_header X-Auth-Request-User $cookie_{session} always;
      return 202;
    }}
  }}

  server {{
    listen 127.0.0.1:{tls_port} ssl;
    ssl_certificate {tmp}/cert.pem;
    ssl_certificate_key {tmp}/key.pem;
    location = /oauth2/auth {{
      internal;
      proxy_pass http://127.0.0.1:{auth_port}/;
      proxy_pass_request_body off;
      proxy_set_header Content-Length "";
    }}
    location {prefix} {{
      auth_request /oauth2/auth;
      auth_request_set $aitp_user $upstream_http_x_auth_request_user;
      proxy_pass http://127.0.0.1:{dash_port};
      proxy_set_header Host $http_host;
      proxy_set_header X-Forwarded-Proto $scheme;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-User $aitp_user;
    }}
  }}

  server {{
    listen 127.0.0.1:{plain_tls_port} ssl;
    ssl_certificate {tmp}/cert.pem;
    ssl_certificate_key {tmp}/key.pem;
    location {prefix} {{
      proxy_pass http://127.0.0.1:{plain_port};
      proxy_set_header Host $http_host;
      proxy_set_header X-Forwarded-Proto $scheme;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
    }}
  }}
}}
"""


def make_certificate(directory: Path) -> Path:
    """A self-signed certificate for 127.0.0.1 (cert.pem, key.pem in ``directory``)."""
    subprocess.run([program("openssl", "openssl"), "req", "-x509", "-newkey", "rsa:2048",
                    "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(directory / "key.pem"), "-out", str(directory / "cert.pem")],
                   check=True, capture_output=True, timeout=60)
    return directory / "cert.pem"


class Nginx:
    """nginx in the foreground with a config of its own, stopped by its pid."""

    def __init__(self, directory: Path, **ports: int) -> None:
        self.directory = directory
        self.ports = ports
        conf = directory / "nginx.conf"
        conf.write_text(NGINX_CONF.format(tmp=directory, prefix=PREFIX, session=SESSION,
                                          **ports))
        self.cmd = [program("nginx", "nginx"), "-p", str(directory), "-e",
                    str(directory / "error.log"), "-c", str(conf)]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Nginx:
        check = subprocess.run([*self.cmd, "-t"], capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stderr
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)

        def up() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.log()
            return all(listening(p) for k, p in self.ports.items()
                       if k in ("tls_port", "plain_tls_port", "auth_port"))

        wait_for(up, "nginx", timeout_s=30.0)
        return self

    def log(self) -> str:
        path = self.directory / "error.log"
        return path.read_text() if path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful: the master stops its workers
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


@dataclass
class Proxied:
    """The running set-up: the two sites' URLs, the store, the CA file for clients."""

    url: str  # the authenticated site, with --proxy-headers
    plain_url: str  # the site in front of a dashboard without it
    dash_port: int
    store: Any
    ca: Path
    decision: dict[str, Any]

    def client(self, signed_in: bool = True, **kwargs: Any) -> httpx.Client:
        cookies = {SESSION: USER} if signed_in else {}
        context = ssl.create_default_context(cafile=str(self.ca))
        return httpx.Client(verify=context, cookies=cookies, timeout=10, **kwargs)


def _seed(proj: Any) -> dict[str, Any]:
    """A live worker's advertisement and a few real decisions (the tasks stay queued)."""
    mw = proj.app.aitp
    mw.store.advertise(WORKER, ["aitp.acme.cpu.hi", "aitp.acme.cpu.mid"],
                       {"tenants": ["acme"], "accelerator": "cpu", "tiers": ["hi", "mid"],
                        "default_queue": False}, ttl_s=3600)
    mw.live.refresh()
    for i in range(3):
        proj.hi.apply_async((i,), headers={"aitp_tenant": "acme"})
    mw.live.flush()
    decisions = mw.store.read_records(mw.store.keys.decisions)
    assert len(decisions) == 3 and decisions[0]["routed"], decisions
    return dict(decisions[-1])


@pytest.fixture(scope="module")
def proxied(redis_url: str) -> Iterator[Proxied]:
    from celery_aitp.dashboard.config import DashboardConfig
    from celery_aitp.dashboard.server import BackgroundServer

    tag = uuid.uuid4().hex[:8]
    env = {"AITP_TEST_BROKER": redis_url, "AITP_TEST_PREFIX": f"aitptest-{tag}",
           "AITP_TEST_QUEUE": f"aitptest-{tag}", "AITP_TEST_POLICY": json.dumps(TEST_POLICY),
           "AITP_TEST_WORKER_TTL": "3600"}  # the advertised worker stays live
    with environment(env):
        sys.modules.pop("tests.apps.proj", None)
        proj = importlib.import_module("tests.apps.proj")
        tmp = Path(tempfile.mkdtemp(prefix="aitp-nginx-"))
        dashboard = DashboardCommand(["--refresh", "0.5", "--url-prefix", PREFIX,
                                      "--proxy-headers", "--auth-header", "X-Forwarded-User",
                                      "--flower-url", FLOWER])
        plain: Any = None
        nginx: Nginx | None = None
        try:
            decision = _seed(proj)
            ca = make_certificate(tmp)
            plain = BackgroundServer(proj.app.aitp, DashboardConfig(
                port=0, url_prefix=PREFIX, refresh_s=0.5)).start()
            dashboard.start()
            tls_port, plain_tls_port = free_port(), free_port()
            nginx = Nginx(tmp, auth_port=free_port(), tls_port=tls_port,
                          plain_tls_port=plain_tls_port, dash_port=dashboard.port,
                          plain_port=plain.port).start()
            yield Proxied(url=f"https://127.0.0.1:{tls_port}",
                          plain_url=f"https://127.0.0.1:{plain_tls_port}",
                          dash_port=dashboard.port, store=proj.app.aitp.store, ca=ca,
                          decision=decision)
        finally:
            if nginx is not None:
                nginx.stop()
            dashboard.stop()
            if plain is not None:
                plain.stop()
            proj.app.aitp.close()
            sys.modules.pop("tests.apps.proj", None)
            _cleanup(redis_url, tag)
            shutil.rmtree(tmp, ignore_errors=True)


def _change_stage(client: httpx.Client, site: str, stage: str) -> httpx.Response:
    """What the stage form does: read the page (CSRF cookie), post JSON with the token."""
    page = client.get(f"{site}{PREFIX}/stage")
    assert page.status_code == 200, page.text
    token = client.cookies["aitp_csrf"]
    return client.post(f"{site}{PREFIX}/api/stage", json={"stage": stage}, headers={
        "X-AITP-CSRF": token, "Origin": site})


def test_nginx_passes_only_signed_in_users_and_the_dashboard_names_them(proxied):
    with proxied.client(signed_in=False) as anonymous:
        assert anonymous.get(f"{proxied.url}{PREFIX}/").status_code == 401  # nginx refuses
    with proxied.client() as client:
        overview = client.get(f"{proxied.url}{PREFIX}/api/overview")
        assert overview.status_code == 200 and overview.json()["workers"]["alive"] == 1
        page = client.get(f"{proxied.url}{PREFIX}/stage")
        assert "Secure" in page.headers["set-cookie"]  # the dashboard knows it is on TLS
        changed = _change_stage(client, proxied.url, "split")
        assert changed.status_code == 200, changed.text
    entry = proxied.store.stage_history(1)[0]
    assert entry["who"] == f"dashboard:{USER}@127.0.0.1" and entry["new"]["stage"] == "split"


def test_redirects_and_metrics_through_the_proxy(proxied):
    with proxied.client() as client:
        bare = client.get(f"{proxied.url}{PREFIX}", follow_redirects=False)
        assert bare.status_code == 307
        assert bare.headers["location"] == f"{proxied.url}{PREFIX}/"  # https, with the port
        metrics = client.get(f"{proxied.url}{PREFIX}/metrics",
                             headers={"Accept-Encoding": "gzip"})
        assert metrics.status_code == 200 and metrics.headers["content-encoding"] == "gzip"
        families = {f.name: f for f in text_string_to_metric_families(metrics.text)}
        assert sum(s.value for s in families["aitp_decisions"].samples) == 3


def test_without_proxy_headers_the_same_proxy_breaks_stage_control(proxied):
    """The control: what the issue reported, and the error message names the fix."""
    before = proxied.store.read_stage()
    with proxied.client() as client:
        refused = _change_stage(client, proxied.plain_url, "takeover")
        assert refused.status_code == 403
        assert "--proxy-headers" in refused.json()["error"]
        bare = client.get(f"{proxied.plain_url}{PREFIX}", follow_redirects=False)
        assert bare.headers["location"].startswith("http://")  # a link out of TLS
    assert proxied.store.read_stage() == before


def test_a_user_header_from_an_untrusted_address_is_ignored(proxied):
    """Straight to the dashboard, around nginx: from 127.0.0.2 (not in
    --forwarded-allow-ips) the header names nobody; from the proxy's address it does."""
    url = f"http://127.0.0.1:{proxied.dash_port}{PREFIX}/api/overview"
    header = {"X-Forwarded-User": "mallory"}
    with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"),
                      timeout=10) as elsewhere:
        assert elsewhere.get(url, headers=header).status_code == 401
        assert elsewhere.get(f"http://127.0.0.1:{proxied.dash_port}{PREFIX}/healthcheck"
                             ).text == "OK"  # probes need no user
    with httpx.Client(timeout=10) as same_host:
        assert same_host.get(url, headers=header).status_code == 200


def _open(page: Any, url: str) -> None:
    page.goto(url)
    page.wait_for_function("() => Number(document.body.dataset.loaded || 0) >= 1",
                           timeout=15_000)


def test_browser_behind_nginx_changes_the_stage_and_links_to_flower(proxied, tmp_path):
    store, site = proxied.store, proxied.url
    errors: list[str] = []
    with browser_context(ignore_https_errors=True,
                         viewport={"width": 1280, "height": 900}) as context:
        context.add_cookies([{"name": SESSION, "value": USER, "url": site}])
        page = context.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))

        page.goto(f"{site}{PREFIX}")  # the dashboard's redirect keeps the browser on https
        page.wait_for_url(f"{site}{PREFIX}/")

        _open(page, f"{site}{PREFIX}/stage")
        page.check("input[name=stage][value=split]")
        page.fill("#split-percent", "30")
        page.fill("#split-tenants", "acme")
        page.click("#stage-submit")
        page.wait_for_function(
            "() => document.querySelector('#stage-result').textContent.trim() === "
            "'applied: split'", timeout=15_000)
        doc = store.read_stage()
        assert doc["stage"] == "split" and doc["split"]["percent"] == 30
        assert store.stage_history(1)[0]["who"] == f"dashboard:{USER}@127.0.0.1"
        page.screenshot(path=str(tmp_path / "stage.png"), full_page=True)

        _open(page, f"{site}{PREFIX}/workers")
        link = page.locator(f"tr[data-worker='{WORKER}'] td[data-field='worker'] a")
        assert link.get_attribute("href") == f"{FLOWER}/worker/{WORKER}"
        page.screenshot(path=str(tmp_path / "workers.png"), full_page=True)

        task_id = proxied.decision["task_id"]
        _open(page, f"{site}{PREFIX}/tasks/{task_id}")
        flower = page.locator("#flower-link")
        flower.wait_for(state="visible", timeout=15_000)
        assert flower.get_attribute("href") == f"{FLOWER}/task/{task_id}"
        page.screenshot(path=str(tmp_path / "task.png"), full_page=True)
    assert errors == [], errors
    for name in ("stage", "workers", "task"):
        assert (tmp_path / f"{name}.png").stat().st_size > 10_000, name
