"""Unit-test fixtures: an app on the in-memory broker with the store on fakeredis."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
from celery import Celery
from celery.signals import after_task_publish, before_task_publish
from hypothesis import HealthCheck, settings

import celery_aitp
from celery_aitp.core.request import read_header
from celery_aitp.store import Keys, RedisStore
from tests.conftest import TEST_POLICY


@pytest.fixture
def store() -> RedisStore:
    return RedisStore(fakeredis.FakeRedis(), Keys("unit"))


@pytest.fixture
def app(store: RedisStore) -> Iterator[Celery]:
    app = Celery("unit", broker="memory://", backend="cache+memory://")
    app.conf.task_default_queue = "default-q"
    mw = celery_aitp.install(app, policy=TEST_POLICY, store=store)

    @app.task(shared=False, aitp={"tier": "hi"})
    def urgent(x: Any = None) -> Any:
        return x

    @app.task(shared=False)
    def plain(x: Any = None) -> Any:
        return x

    @app.task(shared=False, aitp={"accelerator": "gpu", "tier": "mid"})
    def gpu(x: Any = None) -> Any:
        return x

    yield app
    mw.close()


@pytest.fixture
def published() -> Iterator[list[dict[str, Any]]]:
    """Every message published during the test: routing key and headers."""
    seen: list[dict[str, Any]] = []

    def capture(sender: Any = None, headers: Any = None, routing_key: Any = None,
                **_: Any) -> None:
        seen.append({"task": sender, "routing_key": routing_key, "headers": headers})

    after_task_publish.connect(capture, weak=False)
    yield seen
    after_task_publish.disconnect(capture)


@pytest.fixture
def rabbit_app(app: Celery) -> Celery:
    """The unit app, told its broker is RabbitMQ: the layout follows the driver type."""
    app.aitp.broker_driver = "amqp"
    return app


@pytest.fixture
def sent() -> Iterator[list[dict[str, Any]]]:
    """Routing key, message priority, aitp header and declared queues of every message
    about to be published."""
    seen: list[dict[str, Any]] = []

    def capture(routing_key: Any = None, headers: Any = None, properties: Any = None,
                declare: Any = None, **_: Any) -> None:
        seen.append({"routing_key": routing_key, "priority": (properties or {}).get("priority"),
                     "aitp": read_header((headers or {}).get("aitp")),
                     "declare": list(declare or ())})

    before_task_publish.connect(capture, weak=False)
    yield seen
    before_task_publish.disconnect(capture)


def make_live(store: RedisStore, *queues: str, stage: str = "takeover") -> None:
    """Advertise ``queues`` as served and set the stage."""
    store.advertise("w1@test", queues, {}, ttl_s=60)
    store.write_stage({"stage": stage, "split": {}}, who="test")


@pytest.fixture(scope="session")
def synthetic_records() -> list[dict[str, Any]]:
    """A generated workload (see celery_aitp.learn.synthetic), shared by the model tests."""
    from celery_aitp.learn import synthetic

    return list(synthetic.records(3000, seed=5))


@pytest.fixture(scope="session")
def trained(synthetic_records: list[dict[str, Any]]) -> Any:
    """One small trained model (TrainResult), trained once per session (about a second);
    a residual model (it corrects the history estimate), whichever kind would win here."""
    from celery_aitp.learn.train import TrainConfig, train

    return train(synthetic_records, TrainConfig(rounds=40, p90_rounds=10, residual=True))


# --- hostile-input property tests (tests/unit/test_hostile_*.py) ---------------------
# One fixed, deterministic budget for every property test of hostile input, so CI runs
# the same examples each time and the whole set stays well under a minute. Raise it
# locally to search further (AITP_HOSTILE_EXAMPLES=1000); still derandomized.
HOSTILE_EXAMPLES = int(os.environ.get("AITP_HOSTILE_EXAMPLES", "60"))
settings.register_profile(
    "hostile",
    max_examples=HOSTILE_EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                           HealthCheck.data_too_large],
)
