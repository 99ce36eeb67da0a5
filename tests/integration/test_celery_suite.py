"""Celery's own integration tests through celery_aitp in takeover: the default run's part.

The whole comparison (every test of Celery's canvas and tasks modules, in coexistence,
split 50 % and takeover, next to plain Celery) is ``tox -e celery-suite``
(``tests/celery_suite/run.py``), which CI runs after this suite. Here a subset of it runs
in plain Celery and in takeover, side by side: message priority (per call, chains,
chords, retries), retries and task replacement, where a router has most to disturb.
Every test must end as it does in plain Celery, and most deliveries of the takeover run
must come through tier queues.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.celery_suite.run import (
    MODULES,
    ROOT,
    celery_version,
    confirm_differences,
    fetch_suite,
    run_stages,
    summarize,
)
from tests.support.services import IN_CI

pytestmark = [pytest.mark.slow, pytest.mark.redis]

SUBSET = "priority or retried or test_replaced_task_nesting or test_link_error_callback_retries"


def test_celery_suite_subset_ends_as_in_plain_celery(redis_url: str) -> None:
    cache = Path(os.environ.get("AITP_CELERY_SUITE_CACHE", ROOT / ".celery-suite"))
    try:
        tree = fetch_suite(cache, celery_version())
    except subprocess.CalledProcessError as exc:  # no package registry here
        if IN_CI:
            raise
        pytest.skip(f"could not download Celery's source distribution: {exc}")
    targets = [f"t/integration/{m}" for m in MODULES]
    results = run_stages(tree, ["plain", "takeover"], targets, SUBSET, "redis", 20271)
    confirm_differences(results, lambda again, tests: run_stages(
        tree, again, tests, None, "redis", 20271))
    table, ok = summarize(results)
    print(table)
    plain = results["plain"]["outcomes"]
    assert len(plain) >= 10 and "t/integration/test_tasks.py::test_tasks::" \
        "test_task_retried_priority" in plain, table  # the subset ran
    assert ok, table
    tier = results["takeover"]["deliveries"].get("tier", 0)
    assert tier > results["takeover"]["deliveries"].get("other", 0), table
