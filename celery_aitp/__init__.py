"""celery_aitp: intelligent task placement for an existing Celery app.

    import celery_aitp
    celery_aitp.install(app)

Tasks published without an explicit queue are decided (tenant, predicted runtime,
resource profile, priority) and routed to ``aitp.<tenant>.<accelerator>.<tier>`` when a
live AITP worker serves that queue; otherwise they take Celery's default route.
"""

from __future__ import annotations

from typing import Any

from celery_aitp.errors import (
    AdapterError,
    AitpError,
    ModelError,
    PolicyError,
    StageConflict,
    StoreError,
)
from celery_aitp.middleware import Middleware
from celery_aitp.policy import Policy, Stage, load_policy
from celery_aitp.settings import Settings

__all__ = [
    "AdapterError",
    "AitpError",
    "Middleware",
    "ModelError",
    "Policy",
    "PolicyError",
    "Settings",
    "Stage",
    "StageConflict",
    "StoreError",
    "install",
    "load_policy",
]
__version__ = "0.1.0"


def install(app: Any, policy: Any = None, **settings: Any) -> Middleware:
    """Turn the middleware on for ``app``; returns it (also kept as ``app.aitp``).

    ``policy`` may be a Policy, a dict or a YAML/JSON path; when given it is validated
    now, so a bad policy fails at start-up with every bad field named. ``settings``
    override ``aitp_*`` configuration keys (e.g. ``store_url=...``).
    """
    from celery_aitp.policy_history import describe_source
    from celery_aitp.publish.hook import patch_amqp
    from celery_aitp.worker.bootstep import register_worker_extensions

    existing = getattr(app, "aitp", None)
    if isinstance(existing, Middleware):
        return existing
    origin = None
    if policy is not None:
        origin = describe_source(policy)
        policy = load_policy(policy)
    middleware = Middleware(app, policy, policy_origin=origin, **settings)
    app.aitp = middleware
    patch_amqp(app)
    register_worker_extensions(app)
    return middleware
