"""The tenant of the task a worker thread is running, for the tasks it publishes.

Celery publishes chain steps, chord bodies, callbacks and sub-tasks from inside the
running task (before ``task_postrun``) without passing the caller's headers on; the
tenant stage uses this to keep them with the running task's tenant. Set and cleared by
Celery's ``task_prerun`` / ``task_postrun`` signals; reading it is one thread-local
lookup (Celery's own task stack costs about 1 us per read, on every publish).
"""

from __future__ import annotations

import threading
from typing import Any

from celery import signals

from celery_aitp.core.request import header_origin, read_header


class _Running(threading.local):
    """This thread's running task; the class defaults stand for "none" (a miss on a
    plain ``threading.local`` raises and catches AttributeError on every publish)."""

    tenant: str | None = None
    origin: float | None = None
    task_id: str | None = None


_local = _Running()


def current_tenant() -> str | None:
    """The validated tenant of the task this thread runs, or None outside a task."""
    return _local.tenant


def running_origin(task_id: str) -> float | None:
    """When task ``task_id`` was first published, if this thread is running it now.

    A retry is published by the task it retries, so its first-publish time is taken from
    the ``aitp`` header the worker received, never from headers the caller hands over.
    """
    if task_id and _local.task_id == task_id:
        return _local.origin
    return None


def enter(request: Any) -> None:
    """Remember the running task's tenant, first-publish time and id; never raises on
    odd headers. The tenant stage still checks the tenant against the policy.

    The message carries its ``aitp`` header as JSON text; the task gets it as a mapping
    (``self.request.aitp``), as it had before the header became text.
    """
    try:
        raw = getattr(request, "aitp", None)
        header = read_header(raw)
        if header is not None and header is not raw:
            request.aitp = header
        tenant = header.get("tenant") if header is not None else None
    except Exception:  # a header whose reads raise: as if there were none
        header = tenant = None
    _local.tenant = tenant if type(tenant) is str else None
    _local.origin = header_origin(header)
    task_id = getattr(request, "id", None)
    _local.task_id = task_id if type(task_id) is str else None


def leave() -> None:
    _local.tenant = None
    _local.origin = None
    _local.task_id = None


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
