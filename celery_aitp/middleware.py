"""Per-app middleware: settings, store, cached view, pipeline, counters, in one object.

``install(app)`` attaches one :class:`Middleware` as ``app.aitp``. Everything is built
lazily on first use, so installing before ``app.config_from_object`` is fine, and
nothing opens a connection at import time.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from functools import cached_property, partial
from typing import Any

from kombu import Queue

from celery_aitp.errors import PolicyError
from celery_aitp.layout import Layout, layout_for
from celery_aitp.policy import Policy, TenantNames
from celery_aitp.policy_history import PolicyRecorder, describe_source
from celery_aitp.publish.caller_priority import keeps_celery_route, tier_priority
from celery_aitp.publish.hook import AUTO_ROUTE
from celery_aitp.publish.live_view import LiveView, View
from celery_aitp.publish.memo import DecisionMemo, Reused
from celery_aitp.publish.pipeline import Pipeline, default_stages
from celery_aitp.publish.request import Decision, Request
from celery_aitp.publish.stages import GATED_REASONS
from celery_aitp.publish.visibility_stage import (
    REDIS_DRIVERS,
    VISIBILITY_REASONS,
    visibility_timeout_s,
)
from celery_aitp.queues import parse_tier_queue
from celery_aitp.redact import redact
from celery_aitp.settings import Settings, resolve_settings
from celery_aitp.store import Keys, RedisStore, connect
from celery_aitp.store.decision_log import DecisionLog
from celery_aitp.telemetry.buffer import RecordBuffer
from celery_aitp.telemetry.counters import Counters
from celery_aitp.worker.running import current_tenant

logger = logging.getLogger(__name__)

#: Keys a task may declare in ``@app.task(aitp={...})``; others are reported once.
DECLARABLE = frozenset(
    {"accelerator", "tier", "memory_mb", "cpu", "labels", "runtime_hint_s", "impact"}
)
#: Explicit tier-queue publishes that go to the default queue instead.
_TO_DEFAULT = frozenset({"explicit_queue_dead", "explicit_queue_standard"})
_REDIS_SCHEMES = ("redis://", "rediss://", "redis+socket://", "socket://", "unix://")


def explicit_queue_fallback(decision: Decision, tier_queue: bool, live: bool) -> None:
    """Turn the pipeline's decision for a task someone routed into Celery's route, and
    say why: its own queue; or, for a tier queue (``tier_queue``), the default queue
    when no live worker serves it (``live``) or the stage does not route the task now
    (rolled back, or the split's other arm)."""
    gated = decision.reason in GATED_REASONS
    decision.fall_back("explicit_queue")
    if tier_queue:
        if not live:
            decision.reason = "explicit_queue_dead"
        elif gated:
            decision.reason = "explicit_queue_standard"


#: The fallback for each (tier queue, live) pair, made once.
_EXPLICIT_FALLBACKS = {
    (tier, live): partial(explicit_queue_fallback, tier_queue=tier, live=live)
    for tier in (False, True) for live in (False, True)
}


def store_url_for(settings: Settings, broker_url: str | None) -> str:
    """The store URL: explicit setting, else the broker's when it is Redis."""
    if settings.store_url:
        return settings.store_url
    if broker_url and broker_url.startswith(_REDIS_SCHEMES):
        return broker_url
    raise PolicyError(
        "aitp_store_url: required when the broker is not Redis "
        f"(broker: {(broker_url or 'none').split('://')[0]}://...)"
    )


class Middleware:
    """Everything the publish hook and the worker steps share for one Celery app."""

    def __init__(self, app: Any, policy: Any = None, policy_origin: str | None = None,
                 **overrides: Any) -> None:
        self.app = app
        self._policy_source = policy
        self._policy_origin = policy_origin
        self._overrides = overrides
        self.counters = Counters()
        self._declared: dict[str, Mapping[str, Any]] = {}
        self._queues: dict[str, Queue] = {}
        self._tier_targets: dict[str, tuple[Queue, int | None]] = {}  # name -> (queue, priority)
        self._lock = threading.Lock()
        self._config_error_reported = False
        self._priority_route_reported = False
        self._bad_headers_reported: set[str] = set()

    # --- lazily built parts -------------------------------------------------------

    @cached_property
    def settings(self) -> Settings:
        """Resolved once; raises PolicyError with every bad field named."""
        return resolve_settings(self.app.conf, self._policy_source, **self._overrides)

    @property
    def policy(self) -> Policy:
        return self.settings.policy

    @cached_property
    def tenant_names(self) -> TenantNames:
        """Tenants a record's header may name: listed, or unlisted when the policy takes
        them (``unlisted_tenants``)."""
        return TenantNames(self.policy)

    @cached_property
    def store(self) -> RedisStore:
        url = store_url_for(self.settings, self.app.conf.broker_url)
        client = connect(url, self.settings.store_timeout_s)
        return RedisStore(client, Keys(self.settings.key_prefix))

    @cached_property
    def live(self) -> LiveView:
        s = self.settings
        live = LiveView(
            self.store, s.policy, self.counters, s.refresh_interval_s, s.max_staleness_s,
            record_limits={
                self.store.keys.observations: s.observation_maxlen,
                self.store.keys.decisions: s.decision_maxlen,
            },
        )
        for source in self.pipeline.sources():
            live.add_source(source)
        live.set_writer(self.store.keys.decisions, self.decision_log.append)
        live.add_flusher(self.policy_recorder)
        return live

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
    def visibility_timeout_s(self) -> float | None:
        """The Redis transport's ``visibility_timeout`` (read once); None on other brokers."""
        if self.broker_driver not in REDIS_DRIVERS:
            return None
        try:
            return visibility_timeout_s(self.app.conf.broker_transport_options)
        except ValueError as exc:
            raise PolicyError(str(exc)) from None

    @cached_property
    def _visibility_queue(self) -> str:
        """Where the visibility guard sends a task it diverts."""
        guard = self.policy.visibility_guard
        return guard.queue if guard.action == "queue" and guard.queue else self.default_queue

    @cached_property
    def decision_log(self) -> DecisionLog:
        """The decisions stream, indexed by task id (``celery aitp explain``)."""
        return DecisionLog(self.store, self.settings.decision_maxlen, self.policy_digest)

    @cached_property
    def policy_recorder(self) -> PolicyRecorder:
        """Records this process's policy in the store's policy history (once)."""
        return PolicyRecorder(self.policy, self.policy_origin())

    @cached_property
    def policy_digest(self) -> str:
        return self.policy_recorder.digest

    def policy_origin(self) -> str:
        """Where the active policy came from, as settings resolve it (last one wins)."""
        if self._policy_origin:
            return self._policy_origin
        if self._policy_source is not None:
            return describe_source(self._policy_source)
        if self._overrides.get("policy") is not None:
            return describe_source(self._overrides["policy"])
        if os.environ.get("AITP_POLICY"):
            return "AITP_POLICY: " + describe_source(os.environ["AITP_POLICY"])
        conf = self.app.conf.get("aitp_policy") if hasattr(self.app.conf, "get") else None
        if conf is not None:
            return "app.conf.aitp_policy: " + describe_source(conf, "app.conf")
        return describe_source(None)

    def use_stage(self, name: str, stage: Any) -> None:
        """Swap one pipeline stage (how later capabilities plug in).

        Sources the new stage declares are registered with the live view if it exists
        already; otherwise the view picks them up when it is built.
        """
        self.pipeline = self.pipeline.replace(name, stage)
        self.__dict__.pop("memo", None)  # rebuilt for the new stages (or none)
        if "live" in self.__dict__:
            for source in getattr(stage, "sources", ()):
                if not self.live.has_source(source.name):
                    self.live.add_source(source)

    @property
    def default_queue(self) -> str:
        return str(self.app.conf.task_default_queue)

    @cached_property
    def broker_driver(self) -> str:
        """The broker transport's driver type ('redis', 'amqp', 'memory', ...); no I/O."""
        return transport_driver(self.app)

    @cached_property
    def layout(self) -> Layout:
        """How logical tier queues map onto broker queues (see :mod:`celery_aitp.layout`)."""
        return layout_for(self.broker_driver, self.policy.tier_names)

    def queue(self, name: str) -> Queue:
        """The (cached) kombu Queue holding logical or physical tier queue ``name``.

        Declared exactly as workers declare it.
        """
        q = self._queues.get(name)
        if q is None:
            q = self.layout.declaration(self.layout.physical(name))
            self._queues[name] = q
        return q

    def physical_is_live(self, physical: str, live: frozenset[str]) -> bool:
        """Whether some live worker serves a tier queue held in broker queue ``physical``."""
        layout = self.layout
        return physical in live or any(layout.physical(q) == physical for q in live)

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
        now = time.time()
        try:
            auto = auto and not self._keeps_own_priority(options)
            decision = self._decide(name, message, options, auto, now)
        except PolicyError as exc:  # misconfigured (e.g. no store URL with RabbitMQ)
            decision = Decision("unknown", now, name, _task_id(message)).fall_back(
                "config_error")
            self._report_config_error(exc)
        except Exception as exc:
            decision = Decision("unknown", now, name, _task_id(message)).fall_back(
                f"error:{type(exc).__name__}")
            logger.warning("aitp: decision failed for %s, using Celery's route: %s", name,
                           redact(repr(exc)))
        try:
            if isinstance(decision, Reused):
                self._apply_reused(decision, options)
            else:
                self._apply(decision, options, auto)
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
            finish = _EXPLICIT_FALLBACKS[variant]
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
        else:
            args, kwargs = (), {}
        task_id = msg_headers.get("id")
        if type(task_id) is not str:
            task_id = str(task_id or "")
        explicit = None if auto else _queue_name(options.get("queue"))
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
        if explicit and self._is_tier_destination(explicit):
            return True, self.physical_is_live(layout.physical(explicit), view.live_queues)
        return False, False

    def _is_tier_destination(self, name: str) -> bool:
        return parse_tier_queue(name) is not None or self.layout.is_tier_destination(name)

    @cached_property
    def _decision_records(self) -> RecordBuffer:
        return self.live.buffer(self.store.keys.decisions)

    def _headers(self, options: dict[str, Any], task: str) -> dict[str, Any]:
        """A copy of the caller's headers to add ours to (replaced if unusable)."""
        raw = options.get("headers")
        headers = raw.copy() if type(raw) is dict else _caller_headers(raw)
        if headers is None:  # not a mapping, or one that cannot be read: replaced
            self.counters.incr("rejected:headers")
            if task not in self._bad_headers_reported and \
                    len(self._bad_headers_reported) < 1000:  # once per task name
                self._bad_headers_reported.add(task)
                logger.warning("aitp: %s: ignoring headers= that is not a readable mapping "
                               "(counted as rejected:headers)", task)
            headers = {}
        options["headers"] = headers
        return headers

    def _apply_reused(self, reused: Reused, options: dict[str, Any]) -> None:
        """``_apply`` for a kept decision: header, record, counters and route as the
        decision it copies had them (always auto-routed; never a visibility divert)."""
        template = reused.template
        self._headers(options, template.task)["aitp"] = reused.header()
        self._decision_records.add(reused)
        template.tally.append(None)  # counts template.counter, without a lock
        for note in template.notes:
            self.counters.incr(note)
        if template.routed:
            self._send_to_tier(options, template.queue)
        else:
            self._route_fallback(options, template.reason)

    def _apply(self, decision: Decision, options: dict[str, Any], auto: bool) -> None:
        self._headers(options, decision.task)["aitp"] = decision.header()
        # The Decision itself is buffered: the refresher builds its record off this path
        # (not when misconfigured: there is no store to build it for).
        if decision.reason != "config_error":
            self._decision_records.add(decision)
        counters = self.counters
        counters.incr(decision.counter())
        for note in decision.notes:
            counters.incr(note)
        if decision.routed:
            self._send_to_tier(options, decision.queue or "")
        else:
            self._route_fallback(options, decision.reason)

    def _route_fallback(self, options: dict[str, Any], reason: str) -> None:
        """Where a task the middleware does not route goes, by the decision's reason:
        Celery's route as it is, the default queue, or the visibility guard's queue."""
        if reason in _TO_DEFAULT:
            options["queue"] = self.default_queue
            _drop_destination(options)
        elif reason in VISIBILITY_REASONS:
            options["queue"] = self._visibility_queue
            _drop_destination(options)
        elif reason == "explicit_queue":
            explicit = _queue_name(options.get("queue"))
            if explicit and self._is_tier_destination(explicit):
                # e.g. a retry (Celery re-sends it to the queue it came from): declare it
                # as workers do; on RabbitMQ a logical name gives the tier's priority
                priority = options.get("priority")
                self._send_to_tier(options, explicit)
                if parse_tier_queue(explicit) is None and priority is not None:
                    options["priority"] = priority

    def _send_to_tier(self, options: dict[str, Any], name: str) -> None:
        found = self._tier_targets.get(name)
        if found is None:
            # the caller's priority on Redis, the tier's on RabbitMQ (caller_priority.py)
            found = self._tier_targets[name] = (self.queue(name),
                                                tier_priority(self.layout, name))
        options["queue"], priority = found
        if priority is not None:
            options["priority"] = priority
        options.pop("exchange", None)  # Celery takes them from the queue (as in
        options.pop("routing_key", None)  # _drop_destination, unrolled: once per publish)
        options.pop("exchange_type", None)

    def close(self) -> None:
        """Flush telemetry and stop the refresher (process shutdown)."""
        if "live" in self.__dict__:
            self.live.close()


def transport_driver(app: Any) -> str:
    """Driver type of the app's broker transport; builds the transport, never connects."""
    conn = app.connection_for_write()
    try:
        return str(conn.transport.driver_type)
    finally:
        conn.release()


def _caller_headers(raw: Any) -> dict[str, Any] | None:
    """A copy of the caller's headers (theirs is never changed); None if unusable."""
    if raw is None:
        return {}
    if type(raw) is dict:
        return dict(raw)
    if isinstance(raw, Mapping):
        try:
            return dict(raw)
        except Exception:
            return None
    return None


def _task_id(message: Any) -> str:
    """The message's task id for a fallback record; never raises, whatever the message."""
    try:
        headers = getattr(message, "headers", None)
        found = headers.get("id") if type(headers) is dict else None
        return found if type(found) is str else ""
    except Exception:
        return ""


def _drop_destination(options: dict[str, Any]) -> None:
    for key in ("exchange", "routing_key", "exchange_type"):
        options.pop(key, None)


def _queue_name(queue: Any) -> str | None:
    if queue is None:
        return None
    return str(getattr(queue, "name", queue))
