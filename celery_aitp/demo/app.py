"""The demo's Celery app: three tenants, two accelerator classes, sleep-based tasks.

Also a compact example of a real integration: one ``install`` line, task declarations.
"""

from __future__ import annotations

import os
import time

from celery import Celery

import celery_aitp

BROKER = os.environ.get("AITP_DEMO_BROKER", "redis://127.0.0.1:6379/0")

POLICY = {
    "tiers": [{"name": "hi", "sla_s": 1}, {"name": "mid", "sla_s": 5}, {"name": "lo", "sla_s": 30}],
    "tenants": {
        "acme": {"max_tier": "hi", "weight": 3},
        "globex": {"max_tier": "mid", "weight": 2},
        "initech": {"max_tier": "lo", "weight": 1},
        "default": {"max_tier": "lo"},
    },
    "accelerators": ["cpu", "gpu"],
    "stage": "takeover",
}

app = Celery("aitp_demo", broker=BROKER, backend=BROKER)
app.conf.update(
    result_expires=600,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
celery_aitp.install(app, policy=POLICY, key_prefix=os.environ.get("AITP_DEMO_PREFIX", "aitp-demo"))


@app.task(aitp={"tier": "hi"})
def score(items: int) -> int:
    """Short, latency-sensitive work."""
    time.sleep(0.005 + items * 0.0005)
    return items


@app.task(aitp={"tier": "mid"})
def report(rows: int) -> int:
    """Medium batch work."""
    time.sleep(0.02 + rows * 0.0002)
    return rows


@app.task(aitp={"accelerator": "gpu", "tier": "mid"})
def embed(batch: int) -> int:
    """Work that wants an accelerator."""
    time.sleep(0.01 + batch * 0.0005)
    return batch


@app.task
def cleanup(files: int) -> int:
    """Background housekeeping: undeclared, so it gets the lowest tier."""
    time.sleep(0.01)
    return files
