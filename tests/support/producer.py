"""A running producer process for live-switch tests.

Publishes a task every 20 ms for ``argv[1]`` seconds and prints, per publish, the time,
the stage the middleware decided it in (from the ``aitp`` header it sent) and the digest
of the policy it decided by.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from celery.signals import after_task_publish

from celery_aitp.core.request import read_header
from tests.apps.proj import app, noop


def show(headers: Any = None, **_: Any) -> None:
    stage = read_header(headers["aitp"])["stage"]
    print(f"{time.time():.3f} {stage} {app.aitp.policy_digest}", flush=True)


def main() -> None:
    after_task_publish.connect(show, weak=False)
    deadline = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < deadline:
        noop.apply_async(headers={"aitp_tenant": "acme"})
        time.sleep(0.02)
    app.aitp.close()


if __name__ == "__main__":
    main()
