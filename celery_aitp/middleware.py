"""The publisher: the decision on Celery's publish path, for one app.

``install(app)`` attaches one :class:`Middleware` as ``app.aitp``. It is the app's
:class:`~celery_aitp.deployment.Deployment` (settings, store, layout, refresher: what the
CLI, dashboard and workers use) plus what only publishing needs: the stage pipeline, the
decision memo, the task declarations, and ``on_publish``, which never raises.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from functools import cached_property
from typing import Any

from celery_aitp.core.request import Decision, Request
from celery_aitp.core.running import current_tenant
from celery_aitp.core.view import View
from celery_aitp.deployment import Deployment
from celery_aitp.errors import PolicyError
from celery_aitp.layout import Layout
from celery_aitp.publish.annotate import (
    EXPLICIT_FALLBACKS,
    Annotator,
    caller_headers,
    queue_name,
)
from celery_aitp.publish.caller_priority import keeps_celery_route
from celery_aitp.publish.hook import AUTO_ROUTE
from celery_aitp.publish.live_view import LiveView
from celery_aitp.publish.memo import DecisionMemo, Reused
from celery_aitp.publish.pipeline import Pipeline, default_stages
from celery_aitp.redact import redact
from celery_aitp.store import RedisStore

logger = logging.getLogger(__name__)

#: Keys a task may declare in ``@app.task(aitp={...})``; others are reported once.
DECLARABLE = frozenset(
    {"accelerator", "tier", "memory_mb", "cpu", "labels", "runtime_hint_s", "impact"}
)


class Middleware(Deployment):
    """The app's deployment, and the decision for every task it publishes."""

    def __init__(self, app: Any, policy: Any = None, policy_origin: str | None = None,
                 store: RedisStore | None = None, clock: Callable[[], float] = time.time,
                 **overrides: Any) -> None:
        super().__init__(app, policy, policy_origin, store, clock, **overrides)
        self._declared: dict[str, Mapping[str, Any]] = {}
        self._config_error_reported = False
        self._priority_route_reported = False
        self._swapped_stages: dict[str, Any] = {}  # use_stage(), kept across policy changes

    # --- built from the policy ------------------------------------------------------

    def _attach(self, live: LiveView) -> None:
        for source in self.pipeline.sources():
            live.add_source(source)

    @cached_property
    def pipeline(self) -> Pipeline:
        return Pipeline(default_stages(self.policy, self.settings.profile_refresh_s,
                                       visibility_timeout_s=self.visibility_timeout_s,
                                       producer_tenant=self.settings.producer_tenant))

    @cached_property
    def memo(self) -> DecisionMemo | None:
        """Whole decisions kept for reuse (see :mod:`celery_aitp.publish.memo`); None
        when a stage that is not a default one makes the pipeline impure."""
        return DecisionMemo.for_pipeline(self.pipeline, self.counters)

    @cached_property
    def _visibility_queue(self) -> str:
        """Where the visibility guard sends a task it diverts."""
        guard = self.policy.visibility_guard
        return guard.queue if guard.action == "queue" and guard.queue else self.default_queue

    def use_stage(self, name: str, stage: Any) -> None:
        """Swap one pipeline stage (how later capabilities plug in).

        Sources the new stage declares are registered with the live view if it exists
        already; otherwise the view picks them up when it is built.
        """
        self._swapped_stages[name] = stage
        self.pipeline = self.pipeline.replace(name, stage)
        self.__dict__.pop("memo", None)  # rebuilt for the new stages (or none)
        if "live" in self.__dict__:
            for source in getattr(stage, "sources", ()):
                if not self.live.has_source(source.name):
                    self.live.add_source(source)

    def _rebuild(self, live: LiveView | None) -> None:
        """A new policy: the pipeline (with any swapped-in stages), memo and annotator
        are rebuilt, and the live view fetches the new stages' sources."""
        for name in ("pipeline", "memo", "_visibility_queue", "annotator"):
            self.__dict__.pop(name, None)
        pipeline = self.pipeline
        for name, stage in self._swapped_stages.items():
            pipeline = pipeline.replace(name, stage)
        self.pipeline = pipeline
        if live is not None:
            for source in pipeline.sources():
                live.put_source(source)

    def declared(self, task_name: str) -> Mapping[str, Any]:
        """The task's ``aitp={...}`` declaration, validated once per task name."""
        found = self._declared.get(task_name)
        if found is None:
            task = self.app.tasks.get(task_name)
            raw = getattr(task, "aitp", None) if task is not None else None
            found = dict(raw) if isinstance(raw, Mapping) else {}
            unknown = set(found) - DECLARABLE
            if unknown:
                logger.warning("aitp: task %s declares unknown option(s) %s (known: %s)",
                               task_name, sorted(unknown), sorted(DECLARABLE))
            self._declared[task_name] = found
        return found

    # --- the publish path ---------------------------------------------------------

    def on_publish(self, name: str, message: Any, options: dict[str, Any]) -> dict[str, Any]:
        """Decide, annotate and maybe reroute one message. Never raises."""
        auto = bool(options.pop(AUTO_ROUTE, False))
        now = self.clock()
        try:
            auto = auto and not self._keeps_own_priority(options)
            decision = self._decide(name, message, options, auto, now)
        except PolicyError as exc:  # misconfigured (e.g. no store URL with RabbitMQ)
            decision = Decision("unknown", now, name, _task_id(message)).fall_back(
                "config_error")
            self._report_config_error(exc)
            # Celery's route as it is; no annotator (its layout and queues come from
            # the policy, which may be what is wrong): the header and the count only
            options["headers"] = {**(caller_headers(options.get("headers")) or {}),
                                  "aitp": decision.header()}
            self.counters.incr(decision.counter())
            return options
        except Exception as exc:
            decision = Decision("unknown", now, name, _task_id(message)).fall_back(
                f"error:{type(exc).__name__}")
            logger.warning("aitp: decision failed for %s, using Celery's route: %s", name,
                           redact(repr(exc)))
        try:
            if isinstance(decision, Reused):
                self.annotator.apply_reused(decision, options)
            else:
                self.annotator.apply(decision, options)
        except Exception as exc:  # pragma: no cover - defensive: publish must go on
            self.counters.incr("apply_errors")
            logger.error("aitp: could not annotate %s: %s", name, redact(repr(exc)))
        return options

    def _keeps_own_priority(self, options: dict[str, Any]) -> bool:
        """Whether a task nobody routed keeps Celery's route for a priority of its own
        (RabbitMQ: see :mod:`celery_aitp.publish.caller_priority`); counted."""
        if keeps_celery_route(self.layout, options):
            self.counters.incr("explicit_priority")
            if not self._priority_route_reported:  # once: it may be every task
                self._priority_route_reported = True
                logger.info("aitp: on RabbitMQ a task with a message priority of its own "
                            "(priority=, task_default_priority) keeps Celery's route; "
                            "counted as explicit_priority")
            return True
        return False

    def _report_config_error(self, exc: PolicyError) -> None:
        """Log a configuration error once per process (it would repeat on every publish)."""
        if not self._config_error_reported:
            self._config_error_reported = True
            logger.error("aitp: misconfigured, every task takes Celery's route: %s", redact(exc))

    def _decide(self, name: str, message: Any, options: dict[str, Any], auto: bool,
                now: float) -> Decision | Reused:
        """The decision for one message: the memo's (a kept one, or the pipeline's, kept
        for the next task of its key), or the pipeline's when the memo is off."""
        layout = self.layout  # resolved first: a failure here is a decision failure
        request = self._request(name, message, options, auto, now)
        view = self.live.current()
        variant = finish = None
        if not auto:  # someone routed it: it keeps its queue, the decision says why
            variant = self._explicit_variant(request.explicit_queue, view, layout)
            finish = EXPLICIT_FALLBACKS[variant]
        memo = self.memo
        if memo is not None:
            return memo.decide(request, view, now, variant, finish)
        decision = self.pipeline.decide(request, view, now)
        if finish is not None:
            finish(decision)
        return decision

    def _request(self, name: str, message: Any, options: dict[str, Any], auto: bool,
                 now: float) -> Request:
        """What the stages read of a task: Celery's message and the publish options,
        checked types only (odd headers or bodies read as absent); the queue someone
        routed it to unless ``auto``."""
        headers = options.get("headers")
        if type(headers) is not dict:
            headers = headers if isinstance(headers, Mapping) else {}
        msg_headers = message.headers
        if type(msg_headers) is not dict:
            msg_headers = {}
        body = message.body
        if type(body) is tuple and len(body) >= 2:
            args, kwargs = body[0], body[1]
        elif type(body) is dict:  # task protocol 1: the body holds what v2's headers hold
            args, kwargs = body.get("args", ()), body.get("kwargs", {})
            msg_headers = {**body, **msg_headers}
        else:
            args, kwargs = (), {}
        task_id = msg_headers.get("id")
        if type(task_id) is not str:
            task_id = str(task_id or "")
        explicit = None if auto else queue_name(options.get("queue"))
        declared = self._declared.get(name)
        if declared is None:
            declared = self.declared(name)
        return Request.of_message(name, task_id, msg_headers, args, kwargs, headers,
                                  declared, explicit, now, current_tenant())

    def _explicit_variant(self, explicit: str | None, view: View, layout: Layout
                          ) -> tuple[bool, bool]:
        """(a tier queue?, served by a live worker?) for a task sent to queue
        ``explicit``: all its explicit-queue fallback depends on. A tier queue named
        explicitly is almost always a retry staying put."""
        if explicit and self.annotator.is_tier_destination(explicit):
            return True, self.physical_is_live(layout.physical(explicit), view.live_queues)
        return False, False

    @cached_property
    def annotator(self) -> Annotator:
        """Carries decisions out on the publish options (header, record, route)."""
        return Annotator(self.layout, self.queue, self.default_queue, self._visibility_queue,
                         lambda: self.live.buffer(self.store.keys.decisions), self.counters)

def _task_id(message: Any) -> str:
    """The message's task id for a fallback record; never raises, whatever the message."""
    try:
        headers = getattr(message, "headers", None)
        found = headers.get("id") if type(headers) is dict else None
        body = getattr(message, "body", None)
        if found is None and type(body) is dict:  # task protocol 1
            found = body.get("id")
        return found if type(found) is str else ""
    except Exception:
        return ""


