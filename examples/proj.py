"""A plain Celery app with AITP switched on by one line; the app of the compose and
Kubernetes kits.

Run a worker that serves every tenant's CPU tiers (and Celery's default queue), one for
the GPU class, and publish from a shell::

    celery -A examples.proj worker --aitp-tenant '*' --aitp-accelerator cpu -n cpu@%h
    celery -A examples.proj worker --aitp-tenant '*' --aitp-accelerator gpu \\
        --aitp-no-default-queue -n gpu@%h

    >>> from examples.proj import resize, train
    >>> resize.apply_async((800, 600), headers={"aitp_tenant": "acme"})
    >>> train.delay(rows=10_000)            # declared gpu: the GPU-class worker, if live

The policy is ``examples/aitp.yaml``; it starts in the coexistence stage (decide and
record, route nothing): ``celery -A examples.proj aitp stage takeover`` routes everything.
"""

from __future__ import annotations

import os
from pathlib import Path

from celery import Celery

import celery_aitp

app = Celery("proj", broker=os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0"))
app.conf.aitp_policy = str(Path(__file__).with_name("aitp.yaml"))  # AITP_POLICY overrides
celery_aitp.install(app)


@app.task(aitp={"tier": "hi", "runtime_hint_s": 0.05})
def resize(width: int, height: int) -> int:
    """A short, latency-sensitive task (top tier for tenants allowed it)."""
    return width * height


@app.task(aitp={"accelerator": "gpu", "tier": "lo"})
def train(rows: int) -> int:
    """A long task that wants an accelerator."""
    return rows
