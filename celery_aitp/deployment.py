"""What every process of one Celery app shares: settings and policy, the store, the broker
layout, and the background refresher (the live view) with what it ships and follows.

The CLI, the dashboard, the migration tools and the worker steps need only this. The
publisher (:class:`celery_aitp.middleware.Middleware`) adds the decision on the publish
path on top of it. Everything is built lazily on first use, so installing before
``app.config_from_object`` is fine and nothing connects at import time. Tests pass a
store (fakeredis) and a clock instead of patching attributes.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from functools import cached_property
from typing import Any

from kombu import Queue

from celery_aitp.core.view import View
from celery_aitp.errors import PolicyError, StoreError
from celery_aitp.layout import Layout, layout_for
from celery_aitp.policy import Policy, TenantNames
from celery_aitp.policy_history import PolicyRecorder, describe_source, policy_digest
from celery_aitp.policy_live import (
    ACTIVE_POLICY_SOURCE,
    ActivePolicySource,
    TiersDiffer,
    active_policy,
    tiers_differ,
)
from celery_aitp.publish.live_view import LiveView
from celery_aitp.publish.visibility_stage import REDIS_DRIVERS, visibility_timeout_s
from celery_aitp.redact import redact
from celery_aitp.settings import Settings, resolve_settings
from celery_aitp.store import Keys, RedisStore, connect
from celery_aitp.store.decision_log import DecisionLog
from celery_aitp.telemetry.counters import Counters

logger = logging.getLogger(__name__)

_REDIS_SCHEMES = ("redis://", "rediss://", "redis+socket://", "socket://", "unix://")
#: Attributes built from the policy, dropped when the process adopts another one.
POLICY_BUILT = ("decision_log", "policy_recorder", "policy_digest", "tenant_names")


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


def transport_driver(app: Any) -> str:
    """Driver type of the app's broker transport; builds the transport, never connects."""
    conn = app.connection_for_write()
    try:
        return str(conn.transport.driver_type)
    finally:
        conn.release()


class Deployment:
    """One app's shared state (see the module docstring)."""

    def __init__(self, app: Any, policy: Any = None, policy_origin: str | None = None,
                 store: RedisStore | None = None, clock: Callable[[], float] = time.time,
                 **overrides: Any) -> None:
        self.app = app
        self.clock = clock
        self._policy_source = policy
        self._policy_origin = policy_origin
        self._overrides = overrides
        if store is not None:
            self.store = store
        self.counters = Counters()
        self._queues: dict[str, Queue] = {}
        self._lock = threading.Lock()
        self._refused_policy: str | None = None  # an active digest this process rejected

    # --- settings, store, refresher -----------------------------------------------

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
        self._attach(live)
        live.set_writer(self.store.keys.decisions, self.decision_log.append)
        live.add_flusher(self._record_policy)
        live.add_source(ActivePolicySource())
        live.on_refresh(self._follow_active_policy)
        return live

    def _attach(self, live: LiveView) -> None:
        """Register what else the refresher fetches (the publisher's stage sources)."""

    @cached_property
    def decision_log(self) -> DecisionLog:
        """The decisions stream, indexed by task id (``celery aitp explain``)."""
        return DecisionLog(self.store, self.settings.decision_maxlen, self.policy_digest)

    @cached_property
    def policy_recorder(self) -> PolicyRecorder:
        """Records this process's policy in the store's policy history (once)."""
        return PolicyRecorder(self.policy, self.policy_origin())

    def _record_policy(self, store: RedisStore) -> None:
        """Live-view flusher: the recorder of the policy this process decides by now."""
        self.policy_recorder(store)

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

    # --- the live policy (celery_aitp.policy_live) ----------------------------------

    def _follow_active_policy(self, view: View) -> None:
        """After each refresh: adopt the policy applied to the fleet if it is not ours."""
        self._adopt_active(view.sources.get(ACTIVE_POLICY_SOURCE))

    def adopt_active_policy(self) -> None:
        """Adopt the policy applied to the fleet now, not on the first refresher round: a
        worker plans its queues (and checks ``--aitp-tenant``) from its policy when it
        starts, so one restarted after ``policy apply`` with an older file planned from
        that file and never served a tenant class the applied policy added. An
        unreachable store, or none configured, leaves the start-up policy (the refresher
        follows the active one later, as in any other process)."""
        try:
            digest = ActivePolicySource().fetch(self.store, None)
        except (StoreError, PolicyError):  # PolicyError: no store URL (said at start)
            return
        self._adopt_active(digest)

    def _adopt_active(self, digest: str | None) -> None:
        if digest is None or digest in (self.policy_digest, self._refused_policy):
            return
        try:
            policy = active_policy(self.store)
        except StoreError:
            return  # tried again next round
        except PolicyError as exc:
            self._refuse_policy(digest, exc)
            return
        if policy is not None:
            try:
                self.adopt_policy(policy, f"policy apply ({digest})")
            except TiersDiffer as exc:  # a rolling restart to other tiers: not an error
                self._refuse_policy(digest, exc, logging.WARNING)
            except PolicyError as exc:
                self._refuse_policy(digest, exc)

    def _refuse_policy(self, digest: str, exc: Exception, level: int = logging.ERROR) -> None:
        """Keep this process's policy, say so once per applied version, and record it in
        the history as one a process keeps (``policy apply`` and ``rollback`` see its
        tiers are running; ``explain`` finds the policy its decisions name)."""
        self._refused_policy = digest
        self.counters.incr("policy_refused")
        self.policy_recorder.keep(f"refused the applied {digest}: {redact(exc)}"[:500])
        logger.log(level, "aitp: keeping policy %s; the applied policy %s is refused "
                   "here: %s", self.policy_digest, digest, redact(exc))

    def adopt_policy(self, policy: Policy, origin: str) -> None:
        """Decide by ``policy`` from now on: settings and what is built from the policy
        are rebuilt (:meth:`_rebuild` for the rest). Raises PolicyError if this process's
        settings reject it (e.g. its ``aitp_producer_tenant`` is not a tenant of it);
        then nothing changes, and :class:`TiersDiffer` if its tiers differ from this
        process's (they name the queues it routes to or reads: they never change at run
        time, so they are still those of the policy it started with)."""
        if policy_digest(policy) == self.policy_digest:
            return
        differ = tiers_differ(self.policy, policy, origin)
        if differ is not None:
            raise differ
        try:
            settings = type(self.settings).model_validate(
                {**dict(self.settings), "policy": policy})
        except ValueError as exc:  # pydantic's ValidationError
            raise PolicyError(str(exc)) from None
        with self._lock:
            self.__dict__["settings"] = settings
            self._policy_origin = origin
            for name in POLICY_BUILT:
                self.__dict__.pop(name, None)
            self.policy_recorder.done = True  # apply recorded it; a start would not
            live = self.__dict__.get("live")
            if live is not None:
                live.policy = policy
                live.set_writer(self.store.keys.decisions, self.decision_log.append)
            self._rebuild(live)
        self.counters.incr("policy_adopted")
        logger.info("aitp: now deciding by policy %s (%s)", self.policy_digest, origin)

    def _rebuild(self, live: LiveView | None) -> None:
        """Rebuild what a subclass built from the policy (called under the lock)."""

    # --- the broker layout ------------------------------------------------------------

    @property
    def default_queue(self) -> str:
        return str(self.app.conf.task_default_queue)

    @cached_property
    def broker_driver(self) -> str:
        """The broker transport's driver type ('redis', 'amqp', 'memory', ...); no I/O."""
        return transport_driver(self.app)

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

    def close(self) -> None:
        """Flush telemetry and stop the refresher (process shutdown)."""
        if "live" in self.__dict__:
            self.live.close()
