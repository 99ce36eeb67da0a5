"""Worker flags have ``CELERY_WORKER_AITP_*`` environment equivalents."""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def advertised_queues(proj, timeout: float = 15) -> frozenset[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        queues = proj.app.aitp.store.live_queues()
        if queues:
            return queues
        time.sleep(0.1)
    raise AssertionError("no worker advertised any queue")


def test_environment_variables_configure_the_worker(proj, start_worker, deployment):
    env = {
        "CELERY_WORKER_AITP_TENANT": "acme",
        "CELERY_WORKER_AITP_ACCELERATOR": "gpu",
        "CELERY_WORKER_AITP_TIERS": "hi,mid",
        "CELERY_WORKER_AITP_NO_DEFAULT_QUEUE": "1",
    }
    deployment.update(env)
    start_worker("envcfg")
    assert advertised_queues(proj) == {"aitp.acme.gpu.hi", "aitp.acme.gpu.mid"}
    (info,) = proj.app.aitp.store.workers()
    assert info["accelerator"] == "gpu" and info["default_queue"] is False


def test_the_environment_makes_an_express_worker(proj, start_worker, deployment):
    deployment.update({"CELERY_WORKER_AITP_TENANT": "acme", "CELERY_WORKER_AITP_EXPRESS": "1"})
    start_worker("express")
    assert advertised_queues(proj) == {"aitp.acme.cpu.hi"}
    (info,) = proj.app.aitp.store.workers()
    assert info["express"] is True and info["tiers"] == ["hi"]
    assert info["default_queue"] is False
