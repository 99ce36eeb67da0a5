"""celery_aitp: intelligent task placement for an existing Celery app.

    import celery_aitp
    celery_aitp.install(app)

Tasks published without an explicit queue are decided (tenant, predicted runtime,
resource profile, priority) and routed to ``aitp.<tenant>.<accelerator>.<tier>`` when a
live AITP worker serves that queue; otherwise they take Celery's default route.

The package root is lazy: importing it loads no Celery, pydantic or publish code, so a
command line, a tool that only reads a record, or ``celery_aitp.errors`` stay cheap. Each
public name is imported from its module on first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

#: public name -> the module that defines it
_EXPORTS = {
    "AdapterError": "celery_aitp.errors",
    "AitpError": "celery_aitp.errors",
    "ModelError": "celery_aitp.errors",
    "PolicyError": "celery_aitp.errors",
    "StageConflict": "celery_aitp.errors",
    "StoreError": "celery_aitp.errors",
    "Middleware": "celery_aitp.middleware",
    "Policy": "celery_aitp.policy",
    "Stage": "celery_aitp.policy",
    "load_policy": "celery_aitp.policy",
    "Settings": "celery_aitp.settings",
}

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


def __getattr__(name: str) -> Any:
    """Import a public name from its module the first time it is asked for."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'celery_aitp' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def install(app: Any, policy: Any = None, **settings: Any) -> Middleware:
    """Turn the middleware on for ``app``; returns it (also kept as ``app.aitp``).

    ``policy`` may be a Policy, a dict or a YAML/JSON path; when given it is validated
    now, so a bad policy fails at start-up with every bad field named. ``settings``
    override ``aitp_*`` configuration keys (e.g. ``store_url=...``); ``store=`` (a
    ``RedisStore``) and ``clock=`` replace the store and the publish clock (tests).
    """
    from celery_aitp.middleware import Middleware
    from celery_aitp.policy import load_policy
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
