"""The only code on Celery's publish path: a Router and an AMQP sender wrapper.

``AitpRouter`` behaves exactly like Celery's router but marks tasks that nobody routed
(no caller ``queue=``, no ``task_routes`` match, no task-level queue): only those may be
routed to a tier queue. The sender wrapper then asks the middleware for a decision,
adds the ``aitp`` header and, if the decision says so, swaps the queue. Any failure in
the middleware leaves Celery's own route untouched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery.app.amqp import AMQP
from celery.app.routes import Router
from celery.utils.collections import lpmerge

if TYPE_CHECKING:
    from celery_aitp.middleware import Middleware

#: Option key the router adds for tasks the caller left to us; popped before publishing.
AUTO_ROUTE = "_aitp_auto"


class AitpRouter(Router):
    """Celery's router, plus a mark on tasks whose destination nobody chose."""

    def route(self, options: dict[str, Any], name: str, args: Any = (),
              kwargs: Any = None, task_type: Any = None) -> dict[str, Any]:
        kwargs = kwargs if kwargs else {}
        options = self.expand_destination(options)
        if self.routes:
            route = self.lookup_route(name, args, kwargs, options, task_type)
            if route:  # a route may set options only (a priority): still nobody's choice
                options = lpmerge(self.expand_destination(route), options)
        if "queue" in options or options.get("exchange") or options.get("routing_key"):
            return options
        options = lpmerge(self.expand_destination(self.app.conf.task_default_queue), options)
        options[AUTO_ROUTE] = True
        return options


def wrap_sender(send: Any, middleware: Middleware) -> Any:
    """Wrap Celery's ``send_task_message`` so every message passes the middleware first."""

    def send_task_message(producer: Any, name: str, message: Any, **options: Any) -> Any:
        options = middleware.on_publish(name, message, options)
        return send(producer, name, message, **options)

    send_task_message.__wrapped__ = send  # type: ignore[attr-defined]
    return send_task_message


class AitpAMQP(AMQP):
    """Celery's AMQP with the AITP router and sender. Installed by ``install(app)``."""

    def Router(self, queues: Any = None, create_missing: Any = None) -> Router:  # noqa: N802
        return AitpRouter(
            self.routes,
            queues or self.queues,
            self.app.either("task_create_missing_queues", create_missing),
            app=self.app,
        )

    def _create_task_sender(self) -> Any:
        send = super()._create_task_sender()
        return wrap_sender(send, self.app.aitp)


def patch_amqp(app: Any) -> None:
    """Make ``app.amqp`` an :class:`AitpAMQP`, whether or not it was created yet."""
    if "amqp" not in app.__dict__:
        app.amqp_cls = _subclass_of(app.amqp_cls)
        return
    amqp = app.amqp
    if not isinstance(amqp, AitpAMQP):
        amqp.__class__ = _subclass_of(type(amqp))
    for cached in ("router", "send_task_message"):
        amqp.__dict__.pop(cached, None)


def _subclass_of(base: Any) -> type:
    """AitpAMQP itself, or a mix of it with a user's own AMQP subclass."""
    from celery.utils.imports import symbol_by_name

    base = symbol_by_name(base)
    if isinstance(base, type) and issubclass(base, AitpAMQP):
        return base
    if base is AMQP:
        return AitpAMQP
    return type(f"Aitp{base.__name__}", (AitpAMQP, base), {})
