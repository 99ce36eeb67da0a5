"""Late acknowledgement for tier-queue deliveries only, never against a task's own setting.

Strict tier order needs a worker to hold no message in reserve: with prefetch 1 per pool
process, a task acknowledged when it *starts* frees its prefetch slot, and the next
message (perhaps a low tier) then waits in the worker while a higher tier may arrive.
So a strict AITP worker acknowledges a message from one of its tier queues after the run.

Celery decides acks per task (``Task.acks_late``), not per message. Here each task that
leaves ``acks_late`` to the configuration gets a Request class (``Task.Request``, Celery's
hook for it) that reads the delivery's routing key: a delivery from one of the worker's
tier queues sees the task with ``acks_late=True``; any other delivery (the default
queue, a queue of the caller's) sees the task as it is. A task that sets
``acks_late=False`` itself (decorator option, class or base-class attribute,
``task_annotations``) keeps it everywhere, and the worker names it at start-up: such a
task can let one message wait in reserve on a tier queue.

Whether a task "sets it itself" cannot be read off a bound task (Celery writes the
configured value onto the class); :func:`track_declarations` records it when each task
class is created, which for ``@app.task``/``@shared_task`` is at the app's finalisation,
after :func:`celery_aitp.install`.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from celery.app.annotations import resolve_all
from celery.app.task import Task
from kombu.asynchronous import get_event_loop
from kombu.utils.imports import symbol_by_name

#: Task class -> whether its own body (or decorator options) set ``acks_late``.
_declared: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()
_tracking = False


def track_declarations() -> None:
    """Record, for every task class created from now on, whether it sets ``acks_late``.

    Celery's ``bind`` fills an unset ``acks_late`` from ``task_acks_late`` onto the class,
    after which an explicit ``acks_late=False`` and the default look the same. This only
    records (a class hook on Celery's ``Task``); it changes no task. Idempotent.
    """
    global _tracking
    if _tracking:
        return
    previous = Task.__dict__.get("__init_subclass__")

    def _record(cls: type, **kwargs: Any) -> None:
        if previous is not None:
            previous.__func__(cls, **kwargs)
        else:
            super(Task, cls).__init_subclass__(**kwargs)
        _declared[cls] = cls.__dict__.get("acks_late") is not None

    Task.__init_subclass__ = classmethod(_record)
    _tracking = True


def declares_acks_late(task: Any) -> bool | None:
    """Whether ``task`` sets ``acks_late`` itself; None when that cannot be told.

    Looks at the task's class and its bases (as recorded when they were created; a base
    created before tracking counts by its own attribute) and at ``task_annotations``.
    """
    if any("acks_late" in found for found in resolve_all(task.app.annotations, task)):
        return True
    leaf = type(task)
    for klass in leaf.__mro__:
        if klass is Task or klass is object:
            break
        recorded = _declared.get(klass)
        if recorded is None:
            if klass is leaf:
                return None  # created before tracking: Celery's bind has written on it
            recorded = klass.__dict__.get("acks_late") is not None
        if recorded:
            return True
    return False


@dataclass
class AckPlan:
    """Which tasks ack late on tier queues, and the conflicts worth a start-up line."""

    tier_late: list[str] = field(default_factory=list)  # late on tier queues only
    kept_early: list[str] = field(default_factory=list)  # set acks_late=False themselves
    unknown: list[str] = field(default_factory=list)  # created before tracking: kept

    def warnings(self) -> list[str]:
        """The start-up log lines for tasks whose early acks weaken strict tier order."""
        lines = []
        if self.kept_early:
            lines.append(
                "aitp: tasks that set acks_late=False keep it on tier queues too, so one "
                "message may wait in reserve behind each of their runs (strict tier order "
                "is not guaranteed around them; set acks_late=True on them, or run this "
                "worker with --aitp-no-strict to accept it): " + ", ".join(self.kept_early))
        if self.unknown:
            lines.append(
                "aitp: tasks created before celery_aitp.install(app) keep their "
                "acks_late=False (it cannot be told whether they set it): "
                + ", ".join(self.unknown) + "; install the middleware before defining "
                "tasks, or set acks_late on them")
        return lines


def plan_acks(tasks: Iterable[Any]) -> AckPlan:
    """Sort tasks by how a strict worker acknowledges their tier-queue deliveries."""
    plan = AckPlan()
    for task in tasks:
        if task.acks_late:
            continue  # late everywhere already (its own setting or task_acks_late)
        declared = declares_acks_late(task)
        if declared is None:
            plan.unknown.append(task.name)
        elif declared:
            plan.kept_early.append(task.name)
        else:
            plan.tier_late.append(task.name)
    for names in (plan.tier_late, plan.kept_early, plan.unknown):
        names.sort()
    return plan


def ack_tier_deliveries_late(app: Any, tier_queues: Iterable[str]) -> AckPlan:
    """Give tasks of ``plan_acks(...).tier_late`` the tier-aware Request class.

    Runs before the consumer builds its strategies (the bootstep's constructor), which
    is when Celery reads ``Task.Request``.
    """
    queues = frozenset(tier_queues)
    plan = plan_acks(app.tasks.values())
    for name in plan.tier_late:
        task = app.tasks[name]
        task.Request = tier_request_class(symbol_by_name(task.Request), task, queues)
    return plan


def tier_request_class(base: type, task: Any, tier_queues: frozenset[str]) -> type:
    """A subclass of ``base`` (the task's Request class) that acks tier deliveries late."""
    late = object.__new__(type(task))  # copy.copy would give the task itself (__reduce__)
    late.__dict__.update(vars(task), acks_late=True)  # the same task, seen acks_late
    return type(f"TierAck{base.__name__}", (TierAckRequest, base),
                {"tier_queues": tier_queues, "late_task": late})


class TierAckRequest:
    """Mixin for a Request class: deliveries from ``tier_queues`` see ``late_task``.

    Celery reads ``request.task.acks_late`` wherever it acknowledges or rejects, except
    in the ``on_success`` of the class its strategy derives from this one
    (``create_request_cls``), which uses the task's value from start-up; that override is
    wrapped so a tier delivery is acknowledged after a successful run.
    """

    tier_queues: frozenset[str] = frozenset()
    late_task: Any = None
    _task: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        delivery = self.delivery_info  # type: ignore[attr-defined]
        self.tier_delivery = delivery.get("routing_key") in self.tier_queues

    @property
    def task(self) -> Any:
        return self.late_task if self.tier_delivery else self._task

    def acknowledge(self) -> None:
        super().acknowledge()  # type: ignore[misc]
        if self.tier_delivery:
            wake_consumer()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("on_success")
        if own is not None:
            cls.on_success = _ack_after_success(own)  # type: ignore[attr-defined]


def wake_consumer() -> None:
    """Wake the worker's event loop after a late ack.

    The ack frees the process's prefetch slot, but the consumer asks the broker for the
    next message only on its event loop's next turn; when the ack comes from a pool
    thread and nothing else wakes the loop, that turn comes when the loop's poll times out
    (up to a second on Redis) and a free process idles while tasks wait. Celery 5.7 wakes
    the loop after a late ack itself; this makes sure of it and costs one callback.
    """
    hub = get_event_loop()
    if hub is not None:
        hub.call_soon(_nothing)


def _nothing() -> None:
    return None


def _ack_after_success(on_success: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(on_success)
    def wrapper(self: Any, failed__retval__runtime: Any, **kwargs: Any) -> Any:
        result = on_success(self, failed__retval__runtime, **kwargs)
        if self.tier_delivery and not failed__retval__runtime[0]:
            self.acknowledge()  # a no-op if it already was
        return result

    return wrapper
