"""A policy applied with ``celery aitp policy apply`` reaches a running producer and a
running worker without a restart (real Redis, real worker process)."""

from __future__ import annotations

import json
import time

import pytest
import yaml
from click.testing import CliRunner

from tests.conftest import TEST_POLICY
from tests.support.live import wait_live

pytestmark = [pytest.mark.redis, pytest.mark.slow]

GLOBEX_HI = {**TEST_POLICY, "tenants": {**TEST_POLICY["tenants"],
                                        "globex": {"max_tier": "hi"}}}


def test_an_applied_policy_reaches_producer_and_worker_without_restart(deployment, request,
                                                                       tmp_path):
    proj = request.getfixturevalue("proj")
    start_worker = request.getfixturevalue("start_worker")
    start_worker("globex", "--aitp-tenant", "globex", "--aitp-no-default-queue")
    wait_live(proj, "aitp.globex.cpu.hi")
    headers = {"aitp_tenant": "globex"}
    before = proj.where_hi.apply_async((1,), headers=headers).get(timeout=30)
    assert before["queue"] == "aitp.globex.cpu.mid"  # globex is capped at mid
    old = proj.probe.apply_async(headers=headers).get(timeout=30)["policy"]
    assert old == proj.app.aitp.policy_digest

    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(GLOBEX_HI))
    from celery.bin.celery import celery as celery_cli

    out = CliRunner().invoke(celery_cli, ["-A", "tests.apps.proj", "aitp", "policy", "apply",
                                          str(path), "--reason", "globex upgraded"])
    assert out.exit_code == 0, out.output
    deadline = time.monotonic() + 20  # the refresh interval is well under a second here
    queue, worker_policy = before["queue"], old
    while queue != "aitp.globex.cpu.hi" or worker_policy == old:
        assert time.monotonic() < deadline, (queue, worker_policy)
        time.sleep(0.3)
        queue = proj.where_hi.apply_async((2,), headers=headers).get(timeout=30)["queue"]
        worker_policy = proj.probe.apply_async(headers=headers).get(timeout=30)["policy"]
    assert worker_policy == proj.app.aitp.policy_digest != old

    history = CliRunner().invoke(celery_cli, ["-A", "tests.apps.proj", "aitp", "policy",
                                              "history", "--json"])
    assert history.exit_code == 0, history.output
    newest = json.loads(history.output)["history"][0]
    assert newest["reason"] == "globex upgraded" and newest["action"] == "apply"
    back = CliRunner().invoke(celery_cli, ["-A", "tests.apps.proj", "aitp", "policy",
                                           "rollback"])
    assert back.exit_code == 0, back.output
    deadline = time.monotonic() + 20
    while queue != "aitp.globex.cpu.mid":
        assert time.monotonic() < deadline, queue
        time.sleep(0.3)
        queue = proj.where_hi.apply_async((3,), headers=headers).get(timeout=30)["queue"]
