"""A plain Celery app with AITP switched on by one line.

Run a worker that serves acme's CPU tiers and a plain worker for everything else::

    celery -A examples.proj worker --aitp-tenant acme --aitp-accelerator cpu -n aitp@%h
    celery -A examples.proj worker -n plain@%h

then publish from a shell::

    >>> from examples.proj import resize, train
    >>> resize.apply_async((800, 600), headers={"aitp_tenant": "acme"})
    >>> train.delay(rows=10_000)            # declared gpu: plain worker unless a GPU worker runs
"""

from __future__ import annotations

import os

from celery import Celery

import celery_aitp

app = Celery("proj", broker=os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0"))
app.conf.aitp_policy = {
    "tiers": [
        {"name": "critical", "sla_s": 5},
        {"name": "standard", "sla_s": 60},
        {"name": "batch", "sla_s": 3600},
    ],
    "tenants": {"acme": {"max_tier": "critical", "weight": 3}, "globex": {"weight": 1}},
    "accelerators": ["cpu", "gpu"],
    "default_tenant": "globex",
}
celery_aitp.install(app)


@app.task(aitp={"tier": "critical"})
def resize(width: int, height: int) -> int:
    """A short, latency-sensitive task."""
    return width * height


@app.task(aitp={"accelerator": "gpu", "tier": "batch"})
def train(rows: int) -> int:
    """A long task that wants an accelerator."""
    return rows
