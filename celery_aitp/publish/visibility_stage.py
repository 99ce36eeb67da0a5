"""The visibility-timeout guard: tasks that may be delivered twice on Redis.

Kombu's Redis transport gives a message back to the queue once it has been
unacknowledged for longer than ``visibility_timeout`` (3600 s unless
``broker_transport_options`` says otherwise), while the first worker still holds it. An
ETA/countdown task waits unacknowledged in the worker until its ETA; an ``acks_late`` task
(every task on a strict AITP worker) stays unacknowledged while it runs. Either way a task
held longer than the timeout runs twice (celery #3541, #4984, #7918; kombu #337).

The stage reads the threshold once, when the pipeline is built, and per task does two
attribute reads and a comparison unless an ETA is set or the prediction is long. It warns
(at most once per task name per ``log_interval_s``), counts every hit by reason
(``visibility_eta``, ``visibility_runtime``) and, by policy, sends a task the middleware
would route to Celery's default queue or to a named queue instead. It never drops a task
and never moves one the middleware does not route (coexistence, an explicit ``queue=``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from celery_aitp.cache import BoundedDict
from celery_aitp.core.request import Decision, Request
from celery_aitp.core.view import View
from celery_aitp.policy import VisibilityGuardSettings

logger = logging.getLogger("celery_aitp.visibility")

#: Kombu's Redis transport default when ``visibility_timeout`` is not set.
KOMBU_DEFAULT_VISIBILITY_TIMEOUT_S = 3600.0
#: Transport driver types with kombu's visibility-timeout redelivery (redis, rediss and
#: sentinel URLs all use the ``redis`` driver).
REDIS_DRIVERS = frozenset({"redis"})
REASON_ETA = "visibility_eta"
REASON_RUNTIME = "visibility_runtime"
VISIBILITY_REASONS = frozenset({REASON_ETA, REASON_RUNTIME})
#: Task names remembered for the rate-limited warning (send_task may use any name).
_LOG_MEMORY = 1024


def visibility_timeout_s(transport_options: Any) -> float:
    """``visibility_timeout`` from ``broker_transport_options``, kombu's default if unset.

    A value that is not a positive number raises ValueError naming it (kombu would fail
    on it too).
    """
    raw = transport_options.get("visibility_timeout") if isinstance(transport_options, dict) \
        else None
    if raw is None:
        return KOMBU_DEFAULT_VISIBILITY_TIMEOUT_S
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = float("nan")
    if not value > 0:
        raise ValueError(f"broker_transport_options.visibility_timeout: expected a positive "
                         f"number of seconds, got {raw!r}")
    return value


def eta_timestamp(eta: Any) -> float | None:
    """Epoch seconds of Celery's ISO-8601 ``eta`` header (naive means UTC), None if bad."""
    if type(eta) is not str:
        return None
    try:
        when = datetime.fromisoformat(eta)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


class VisibilityStage:
    """Counts, warns about and (by policy) diverts tasks near ``visibility_timeout``."""

    name = "visibility"

    def __init__(self, settings: VisibilityGuardSettings, timeout_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self.limit_s = settings.margin * timeout_s
        self.use_p90 = settings.runtime == "p90"
        self.divert = settings.action != "warn"
        self.action = settings.action
        self.log_interval_s = settings.log_interval_s
        self._clock = clock
        self._logged: BoundedDict[str, float] = BoundedDict(_LOG_MEMORY)

    def __call__(self, request: Request, decision: Decision, view: View) -> None:
        p50, p90 = decision.predicted_runtime_s, decision.predicted_p90_s
        if request.eta is None and self.passes(p50, p90):
            return  # the common case
        self._check(request, decision, p90 if self.use_p90 else p50)

    def memo_key(self, request: Request, decision: Decision, view: View) -> tuple[()] | None:
        """Nothing for a task that passes unchecked (its prediction is in the key); a
        task the guard looks at is decided each time (the warning is rate-limited)."""
        if request.eta is None and self.passes(decision.predicted_runtime_s,
                                               decision.predicted_p90_s):
            return ()
        return None

    def passes(self, p50: float | None, p90: float | None) -> bool:
        """Whether a task with no ETA and this prediction passes unchecked (what
        ``__call__`` reads first, for a caller that has the prediction alone)."""
        runtime = p90 if self.use_p90 else p50
        return runtime is None or runtime <= self.limit_s

    def _check(self, request: Request, decision: Decision, runtime: float | None) -> None:
        if runtime is None:
            runtime = decision.predicted_runtime_s  # no p90: the median is all there is
        at = eta_timestamp(request.eta)
        wait = max(0.0, at - decision.decided_at) if at is not None else 0.0
        run = runtime if runtime is not None and runtime > 0 else 0.0
        if wait + run <= self.limit_s:
            return
        reason = REASON_ETA if wait >= run else REASON_RUNTIME
        decision.notes.append(reason)
        diverted = self.divert and decision.routed
        if diverted:
            decision.fall_back(reason)
        self._warn(request.task, reason, wait, run, diverted)

    def _warn(self, task: str, reason: str, wait: float, run: float, diverted: bool) -> None:
        now = self._clock()
        last = self._logged.get(task)
        if last is not None and now - last < self.log_interval_s:
            return
        self._logged.put(task, now)
        what = "sent to the default queue" if self.action == "default_queue" else \
            "sent to the visibility_guard queue" if self.action == "queue" else "route unchanged"
        logger.warning(
            "aitp: task %s may be delivered twice: ETA in %.0f s plus predicted run %.0f s "
            "exceeds %.0f%% of the Redis visibility_timeout (%.0f s); counted as %s, %s. "
            "Raise broker_transport_options['visibility_timeout'] above the longest ETA "
            "plus run (logged at most every %.0f s per task)",
            task, wait, run, 100 * self.limit_s / self.timeout_s, self.timeout_s, reason,
            what if diverted or self.action == "warn" else "not routed by aitp: Celery's route",
            self.log_interval_s)
