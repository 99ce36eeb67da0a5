"""A caller's message priority and the tier queues: how the two combine.

Celery takes a task's priority from the call (``apply_async(priority=...)``), the task
(its ``priority`` attribute, ``task_default_priority``), the parent task
(``task_inherit_parent_priority``) or the delivery a retry repeats, and the worker hands
it to the task as ``request.delivery_info['priority']``. celery_aitp keeps its value and
its meaning for ordering:

- Redis (and the memory transport): the message keeps its priority inside the tier
  queue. Kombu reads priority levels before queue order, so, as for any queues a plain
  Celery worker reads, a priority ranks the task among everything the worker reads, and
  tasks of equal priority (every task, when nobody sets one) come in tier order.
- RabbitMQ: a tier queue's message priority is the tier (one priority queue per tenant
  and accelerator, :mod:`celery_aitp.layout`), so a priority of the task's own is a
  choice of destination, like ``queue=``: the task keeps Celery's route, where its
  priority means what it always did. Counted as ``explicit_priority``.
"""

from __future__ import annotations

from typing import Any

from celery_aitp.layout import Layout


def keeps_celery_route(layout: Layout, options: dict[str, Any]) -> bool:
    """Whether a task nobody routed keeps Celery's route for a priority of its own."""
    return not layout.keeps_caller_priority and options.get("priority") is not None


def tier_priority(layout: Layout, logical: str) -> int | None:
    """The message priority a task sent to tier queue ``logical`` gets; None: its own."""
    return None if layout.keeps_caller_priority else layout.priority(logical)
