"""pytest plugin: Celery's own integration tests, with celery_aitp installed.

Loaded as ``-p tests.celery_suite.plugin`` into a run of the ``t/integration`` tests of
Celery's source distribution; ``tests/celery_suite/run.py`` fetches them and runs every
stage side by side with plain Celery. Celery's files are never changed: everything the
suite needs is done here, each for the reason given.

``AITP_SUITE_STAGE=plain`` changes nothing but counting. With ``coexistence``, ``split``
or ``takeover`` the plugin

1. installs celery_aitp into every app the suite builds (Celery's ``TestApp``, used by
   its ``celery_app`` and ``celery_session_app`` fixtures), with the stage in the policy
   (split: 50 %), a store key prefix of its own (``AITP_SUITE_PREFIX``) and the suite's
   Redis result backend as the store, as a user adds the one line to an app;
2. starts the suite's session worker as an AITP worker serving every tenant (its
   ``celery_worker_parameters``), as ``celery worker --aitp-tenant '*'`` does;
3. accepts AITP's tier queues in the suite's teardown check. Celery's conftest fails a
   test when an app knows a queue other than ``celery`` ("tests that need additional
   queues belong in t/smoke/tests/"). An AITP worker adds the tier queues it consumes to
   its app's queues by design, so that failure is turned into a pass when, and only when,
   it is the session app's and every other queue it names is a tier queue (counted as
   ``teardown_checks_accepted``);
4. closes each test's app's middleware after the test (its background refresher).

In every stage it counts the deliveries the session worker received, through a tier
queue or not, and writes each test's outcome and the counts to ``AITP_SUITE_REPORT``
(JSON) at the end.
"""

from __future__ import annotations

import ast
import json
import os
import re
from collections import Counter
from typing import Any

import pytest

STAGE = os.environ.get("AITP_SUITE_STAGE", "plain")
AITP = STAGE != "plain"
_TEARDOWN_CHECK = re.compile(
    r"Integration session app must only use the shared celery queue; found (\[.*?\])\.")

outcomes: dict[str, str] = {}
deliveries: Counter[str] = Counter()
accepted: list[str] = []
subtests_failed: set[str] = set()


def is_tier_queue(name: str) -> bool:
    """An AITP tier queue on either broker: ``aitp.<tenant>.<accelerator>[.<tier>]``."""
    from celery_aitp.queues import PREFIX

    parts = name.split(".")
    return parts[0] == PREFIX and len(parts) in (3, 4) and all(parts)


#: The suite's tasks name no tenant, so all are this one's: tier queues of its own
#: (``aitp.celerysuite.*``), apart from any other test deployment on the same broker.
TENANT = "celerysuite"


def suite_policy(stage: str = STAGE) -> dict[str, Any]:
    """The default policy with one tenant, in this run's stage (split: half the traffic)."""
    return {"stage": stage, "split": {"percent": 50}, "tenants": {TENANT: {}},
            "default_tenant": TENANT}


def pytest_configure(config: pytest.Config) -> None:
    from celery.signals import task_received

    task_received.connect(_count_delivery, weak=False)
    if AITP:
        _install_into_test_apps()


def _install_into_test_apps() -> None:
    """Wrap Celery's ``TestApp`` factory so each app it builds gets celery_aitp."""
    import celery.contrib.testing.app as testing_app

    import celery_aitp

    build = testing_app.TestApp
    prefix = os.environ.get("AITP_SUITE_PREFIX", f"aitp-suite-{STAGE}")
    store_url = os.environ.get("TEST_BACKEND")  # the run's private Redis (RabbitMQ needs it)

    def test_app_with_aitp(*args: Any, **kwargs: Any) -> Any:
        app = build(*args, **kwargs)
        celery_aitp.install(app, policy=suite_policy(), key_prefix=prefix,
                            store_url=store_url)
        return app

    testing_app.TestApp = test_app_with_aitp


def _count_delivery(request: Any = None, **_: Any) -> None:
    info = getattr(request, "delivery_info", None) or {}
    queue = str(info.get("routing_key") or "")
    deliveries["tier" if is_tier_queue(queue) else "other"] += 1


@pytest.fixture(scope="session")
def celery_worker_parameters() -> dict[str, Any]:
    """The session worker's options: an AITP worker for every tenant (not in plain)."""
    return {"aitp_tenant": "*"} if AITP else {}


@pytest.fixture(autouse=True)
def _aitp_close_test_app(request: pytest.FixtureRequest) -> Any:
    app = request.getfixturevalue("app") if AITP and "app" in request.fixturenames else None
    yield
    middleware = getattr(app, "aitp", None)
    if middleware is not None:
        middleware.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if AITP and call.when == "teardown" and report.failed and _only_tier_queues(call):
        report.outcome = "passed"
        report.longrepr = None
        accepted.append(item.nodeid)
    return report


def _only_tier_queues(call: pytest.CallInfo[None]) -> bool:
    """Whether the teardown failed only on the session app's tier queues."""
    if call.excinfo is None:
        return False
    error = call.excinfo.value
    errors = getattr(error, "exceptions", None) or (error,)  # several: an exception group
    return all(_is_tier_queue_check(e) for e in errors)


def _is_tier_queue_check(error: BaseException) -> bool:
    if not isinstance(error, pytest.fail.Exception):
        return False
    found = _TEARDOWN_CHECK.search(str(error))
    if found is None:
        return False
    names = ast.literal_eval(found.group(1))
    return "celery" in names and all(n == "celery" or is_tier_queue(n) for n in names)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each test's final outcome: the last attempt counts (reruns are retried attempts);
    a failed subtest fails its test, as pytest's own summary counts it."""
    node = report.nodeid
    if report.outcome == "rerun":
        outcomes[node] = "rerun"
    elif report.when == "setup":
        subtests_failed.discard(node)
        outcomes[node] = ("error" if report.failed else
                          "skipped" if report.skipped else "passed")
    elif report.when == "call" and getattr(report, "context", None) is not None:
        if report.failed:  # a subtest's report
            subtests_failed.add(node)
    elif report.when == "call":
        outcomes[node] = ("failed" if report.failed or node in subtests_failed
                          else report.outcome)
    elif report.when == "teardown" and report.failed and outcomes.get(node) == "passed":
        outcomes[node] = "error"


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("AITP_SUITE_REPORT")
    if not path:
        return
    import celery

    with open(path, "w") as out:
        json.dump({"stage": STAGE, "outcomes": outcomes, "deliveries": dict(deliveries),
                   "teardown_checks_accepted": len(accepted), "celery": celery.__file__},
                  out, indent=1, sort_keys=True)
