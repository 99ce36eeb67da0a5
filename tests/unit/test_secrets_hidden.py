"""Broker and store passwords never appear in dashboard pages, JSON, metrics, logs or CLI.

Every deployment here has passwords in its broker and store URLs; the servers behind them
are unreachable (port 1 refuses at once) or a fake, so every error path that echoes a
client library's message is exercised too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from types import SimpleNamespace

import fakeredis
import pytest
from celery import Celery
from click.testing import CliRunner
from starlette.testclient import TestClient

import celery_aitp
from celery_aitp.cli.celery_command import aitp
from celery_aitp.cli.output import fail
from celery_aitp.core.request import read_header
from celery_aitp.dashboard.app import build_dashboard, create_app
from celery_aitp.dashboard.config import DashboardConfig
from celery_aitp.redact import MASK, redact
from celery_aitp.store import Keys, RedisStore
from celery_aitp.store.redis_store import translated_errors
from tests.conftest import TEST_POLICY

BROKER_PW = "brok3r-Pa55w0rd"
STORE_PW = "st0re-Pa55w0rd"
BROKER = f"redis://celery:{BROKER_PW}@127.0.0.1:1/2"
STORE = f"redis://aitp:{STORE_PW}@127.0.0.1:1/3"
SECRETS = (BROKER_PW, STORE_PW)


def assert_hidden(text: str, where: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{where} shows a password: {text[:300]!r}"


@pytest.mark.parametrize(("text", "expected"), [
    ("redis://:s3cret@h:6379/0", "redis://:***@h:6379/0"),
    ("amqp://guest:guest@h:5672/vh", "amqp://guest:***@h:5672/vh"),
    ("rediss://u:p@ss@h/0 and redis://:x@y/1", "rediss://u:***@h/0 and redis://:***@y/1"),
    ("redis://h/0?password=zz&db=1", "redis://h/0?password=***&db=1"),
    ("sentinel://:pw@h1:26379;sentinel://:pw@h2:26379",
     "sentinel://:***@h1:26379;sentinel://:***@h2:26379"),
    ("redis://h:6379/0", "redis://h:6379/0"), ("redis://user@h/0", "redis://user@h/0"),
    ("Error 111 connecting to h:6379.", "Error 111 connecting to h:6379."),
])
def test_redact_masks_url_passwords_like_kombu(text: str, expected: str) -> None:
    assert redact(text) == expected
    assert MASK == "***"


def test_store_errors_are_redacted_at_the_source() -> None:
    with pytest.raises(Exception) as caught, translated_errors():
        raise OSError(f"cannot reach {STORE}")
    assert_hidden(str(caught.value), "StoreError")
    assert "redis://aitp:***@127.0.0.1:1/3" in str(caught.value)


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("secret", broker=BROKER, backend="cache+memory://")
    app.conf.task_default_queue = "default-q"
    app.conf.broker_connection_timeout = 0.5
    mw = celery_aitp.install(app, policy=TEST_POLICY, store_url=STORE, store_timeout_s=0.2,
                             max_staleness_s=0.5)

    @app.task(shared=False, name="secret.work")
    def work() -> None: ...

    yield app
    mw.close()


#: The test client's Host ("testserver") is a name the dashboard must be told to answer.
CONFIG = DashboardConfig(refresh_s=0.2, allowed_hosts=("testserver",))


def every_get(client: TestClient, prefix: str = "") -> dict[str, str]:
    """The body of every GET route: pages, API (a task page too), metrics, probes."""
    paths = ["/", "/tenants", "/queues", "/workers", "/predictions", "/tasks", "/tasks/x1",
             "/stage", "/api", "/api/overview", "/api/tenants", "/api/queues", "/api/workers",
             "/api/predictions", "/api/tasks", "/api/tasks/x1", "/api/stage", "/metrics",
             "/healthz", "/readyz"]
    return {path: client.get(prefix + path).text for path in paths}


def test_dashboard_with_the_store_and_broker_unreachable(app: Celery) -> None:
    dashboard = build_dashboard(app.aitp, CONFIG, version="t")
    client = TestClient(create_app(dashboard))
    bodies = every_get(client)
    for path, body in bodies.items():
        assert_hidden(body, path)
    assert "store unreachable" in bodies["/api/overview"] + bodies["/readyz"]
    post = client.post("/api/stage", json={"stage": "split"})
    assert_hidden(post.text, "POST /api/stage")


def test_dashboard_with_a_live_store_and_the_broker_unreachable(app: Celery) -> None:
    app.aitp.store = RedisStore(fakeredis.FakeRedis(), Keys("secret"))
    app.aitp.store.write_stage({"stage": "takeover", "split": {}}, who="test")
    dashboard = build_dashboard(app.aitp, CONFIG, version="t")
    bodies = every_get(TestClient(create_app(dashboard)))
    for path, body in bodies.items():
        assert_hidden(body, path)
    readyz = TestClient(create_app(dashboard)).get("/readyz").json()
    assert readyz["checks"]["broker"]["ok"] is False  # the broker error was shown, redacted
    assert "aitp_broker_up 0.0" in bodies["/metrics"]


def test_publishing_and_its_logs_with_everything_unreachable(
        app: Celery, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    options = app.aitp.on_publish("secret.work", SimpleNamespace(headers={"id": "1"}, body=()),
                                  {"_aitp_auto": True, "queue": "default-q"})
    assert read_header(options["headers"]["aitp"])["reason"] == "store_unreachable"
    app.aitp.live.refresh()
    app.aitp.close()
    for record in caplog.records:
        assert_hidden(record.getMessage(), f"log {record.name}")
        if record.exc_text:
            assert_hidden(record.exc_text, f"log traceback {record.name}")


def test_a_config_error_is_logged_without_the_url(caplog: pytest.LogCaptureFixture) -> None:
    app = Celery("secret-amqp", broker=f"amqp://celery:{BROKER_PW}@127.0.0.1:1//")
    mw = celery_aitp.install(app, policy=TEST_POLICY)  # no store URL with RabbitMQ
    caplog.set_level(logging.DEBUG)
    options = mw.on_publish("t", SimpleNamespace(headers={"id": "1"}, body=()),
                            {"_aitp_auto": True})
    assert read_header(options["headers"]["aitp"])["reason"] == "config_error"
    assert any("aitp_store_url: required" in r.getMessage() for r in caplog.records)
    for record in caplog.records:
        assert_hidden(record.getMessage(), "config error log")


@pytest.mark.parametrize("args", [
    ["status"], ["status", "--json"], ["stage"], ["stage", "split", "--percent", "5"],
    ["model"], ["explain", "some-id"], ["history"], ["evacuate"],
])
def test_cli_output_hides_passwords(app: Celery, args: list[str]) -> None:
    result = CliRunner().invoke(aitp, args, obj=SimpleNamespace(app=app))
    output = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert result.exit_code != 0, output  # nothing is reachable
    assert_hidden(output, f"celery aitp {' '.join(args)}")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        assert_hidden(repr(result.exception), f"exception of {args}")


def test_fail_redacts_whatever_it_is_given(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        fail(f"could not connect to {BROKER}")
    err = capsys.readouterr().err
    assert_hidden(err, "fail()")
    assert "redis://celery:***@127.0.0.1:1/2" in err


@pytest.mark.parametrize("args", [["status"], ["status", "--json"], ["stage"], ["history"],
                                  ["policy"]])
def test_cli_output_with_a_live_store_hides_passwords(app: Celery, args: list[str]) -> None:
    app.aitp.store = RedisStore(fakeredis.FakeRedis(), Keys("secret"))
    app.aitp.store.add_counts({"decisions:takeover:default:lo:cpu:no_live_worker": 1})
    result = CliRunner().invoke(aitp, args, obj=SimpleNamespace(app=app))
    assert result.exit_code == 0, result.output
    assert_hidden(result.output, f"celery aitp {' '.join(args)}")


def test_every_package_error_is_redacted_when_made() -> None:
    from celery_aitp.errors import AdapterError, ModelError, PolicyError, StoreError

    for kind in (AdapterError, ModelError, PolicyError, StoreError):
        assert str(kind(f"while talking to {BROKER}")) == \
            "while talking to redis://celery:***@127.0.0.1:1/2"
