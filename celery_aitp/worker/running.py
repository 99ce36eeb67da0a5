"""The tenant of the task a worker thread is running, for the tasks it publishes.

Celery publishes chain steps, chord bodies, callbacks and sub-tasks from inside the
running task (before ``task_postrun``) without passing the caller's headers on; the
tenant stage uses this to keep them with the running task's tenant. Set and cleared by
Celery's ``task_prerun`` / ``task_postrun`` signals; reading it is one thread-local
lookup (Celery's own task stack costs about 1 us per read, on every publish).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from celery import signals

_local = threading.local()


def current_tenant() -> str | None:
    """The validated tenant of the task this thread runs, or None outside a task."""
    return getattr(_local, "tenant", None)


def enter(request: Any) -> None:
    """Remember the running task's tenant (a string, or None); never raises on odd headers.

    The tenant stage still checks it against the policy before a sub-task uses it.
    """
    try:
        header = getattr(request, "aitp", None)
        tenant = header.get("tenant") if isinstance(header, Mapping) else None
    except Exception:
        tenant = None
    _local.tenant = tenant if type(tenant) is str else None


def leave() -> None:
    _local.tenant = None


def connect(app: Any) -> None:
    """Track the running task's tenant for ``app``'s tasks (once per app)."""
    if getattr(app, "_aitp_running_connected", False):
        return
    app._aitp_running_connected = True

    def prerun(task: Any = None, **_: Any) -> None:
        if task is not None and task.app is app:
            enter(task.request)

    def postrun(task: Any = None, **_: Any) -> None:
        if task is not None and task.app is app:
            leave()

    signals.task_prerun.connect(prerun, weak=False)
    signals.task_postrun.connect(postrun, weak=False)
