"""Writing a decision onto Celery's publish options: the last step of ``on_publish``.

The pipeline decides; this module only carries the decision out: our ``aitp`` header in a
copy of the caller's headers, the decision record and counters, and the route: the tier
queue (declared as workers declare it, with the priority the broker layout gives it),
Celery's default queue, the visibility guard's queue, or Celery's own route untouched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from kombu import Queue

from celery_aitp.core.request import EXPLICIT_QUEUE, Decision
from celery_aitp.layout import Layout
from celery_aitp.publish.caller_priority import tier_priority
from celery_aitp.publish.gate_stage import GATED_REASONS
from celery_aitp.publish.memo import Reused
from celery_aitp.publish.visibility_stage import VISIBILITY_REASONS
from celery_aitp.queues import parse_tier_queue
from celery_aitp.telemetry.buffer import RecordBuffer
from celery_aitp.telemetry.counters import Counters

logger = logging.getLogger(__name__)

#: Explicit tier-queue publishes that go to the default queue instead.
_TO_DEFAULT = frozenset({"explicit_queue_dead", "explicit_queue_standard"})
#: Task names whose unreadable ``headers=`` were reported (once each), at most this many.
_REPORT_LIMIT = 1000


def explicit_queue_fallback(decision: Decision, tier_queue: bool, live: bool) -> None:
    """Turn the pipeline's decision for a task someone routed into Celery's route, and
    say why: its own queue; or, for a tier queue (``tier_queue``), the default queue
    when no live worker serves it (``live``) or the stage does not route the task now
    (rolled back, or the split's other arm)."""
    gated = decision.reason in GATED_REASONS
    decision.fall_back(EXPLICIT_QUEUE)
    if tier_queue:
        if not live:
            decision.reason = "explicit_queue_dead"
        elif gated:
            decision.reason = "explicit_queue_standard"


#: The fallback for each (tier queue, live) pair, made once.
EXPLICIT_FALLBACKS = {
    (tier, live): partial(explicit_queue_fallback, tier_queue=tier, live=live)
    for tier in (False, True) for live in (False, True)
}


def queue_name(queue: Any) -> str | None:
    """The name in a ``queue=`` option (a name or a kombu Queue); None when absent."""
    if queue is None:
        return None
    return str(getattr(queue, "name", queue))


class Annotator:
    """Carries decisions out on one process's publish options."""

    def __init__(self, layout: Layout, queue_of: Callable[[str], Queue], default_queue: str,
                 visibility_queue: str, records_of: Callable[[], RecordBuffer],
                 counters: Counters) -> None:
        self.layout = layout
        self.queue_of = queue_of  # the kombu Queue of a logical or physical tier queue
        self.default_queue = default_queue
        self.visibility_queue = visibility_queue
        self._records_of = records_of  # the store is resolved only when a record is made:
        self._records: RecordBuffer | None = None  # a misconfigured app has none
        self.counters = counters
        self._tier_targets: dict[str, tuple[Queue, int | None]] = {}  # name -> (queue, priority)
        self._bad_headers_reported: set[str] = set()

    @property
    def records(self) -> RecordBuffer:
        """The decision records' buffer, shipped by the live view's refresher."""
        if self._records is None:
            self._records = self._records_of()
        return self._records

    def is_tier_destination(self, name: str) -> bool:
        return parse_tier_queue(name) is not None or self.layout.is_tier_destination(name)

    def apply(self, decision: Decision, options: dict[str, Any]) -> None:
        self._headers(options, decision.task)["aitp"] = decision.header()
        # The Decision itself is buffered: the refresher builds its record off this path
        # (not when misconfigured: there is no store to build it for).
        if decision.reason != "config_error":
            self.records.add(decision)
        counters = self.counters
        counters.incr(decision.counter())
        for note in decision.notes:
            counters.incr(note)
        if decision.routed:
            self.send_to_tier(options, decision.queue or "")
        else:
            self._route_fallback(options, decision.reason)

    def apply_reused(self, reused: Reused, options: dict[str, Any]) -> None:
        """``apply`` for a kept decision: header, record, counters and route as the
        decision it copies had them (always auto-routed; never a visibility divert)."""
        template = reused.template
        self._headers(options, template.task)["aitp"] = reused.header()
        self.records.add(reused)
        template.tally.append(None)  # counts template.counter, without a lock
        for note in template.notes:
            self.counters.incr(note)
        if template.routed:
            self.send_to_tier(options, template.queue)
        else:
            self._route_fallback(options, template.reason)

    def send_to_tier(self, options: dict[str, Any], name: str) -> None:
        found = self._tier_targets.get(name)
        if found is None:
            # the caller's priority on Redis, the tier's on RabbitMQ (caller_priority.py)
            found = self._tier_targets[name] = (self.queue_of(name),
                                                tier_priority(self.layout, name))
        options["queue"], priority = found
        if priority is not None:
            options["priority"] = priority
        options.pop("exchange", None)  # Celery takes them from the queue (as in
        options.pop("routing_key", None)  # _drop_destination, unrolled: once per publish)
        options.pop("exchange_type", None)

    def _route_fallback(self, options: dict[str, Any], reason: str) -> None:
        """Where a task the middleware does not route goes, by the decision's reason:
        Celery's route as it is, the default queue, or the visibility guard's queue."""
        if reason in _TO_DEFAULT:
            options["queue"] = self.default_queue
            _drop_destination(options)
        elif reason in VISIBILITY_REASONS:
            options["queue"] = self.visibility_queue
            _drop_destination(options)
        elif reason == EXPLICIT_QUEUE:
            explicit = queue_name(options.get("queue"))
            if explicit and self.is_tier_destination(explicit):
                # e.g. a retry (Celery re-sends it to the queue it came from): declare it
                # as workers do; on RabbitMQ a logical name gives the tier's priority
                priority = options.get("priority")
                self.send_to_tier(options, explicit)
                if parse_tier_queue(explicit) is None and priority is not None:
                    options["priority"] = priority

    def _headers(self, options: dict[str, Any], task: str) -> dict[str, Any]:
        """A copy of the caller's headers to add ours to (replaced if unusable)."""
        raw = options.get("headers")
        headers = raw.copy() if type(raw) is dict else caller_headers(raw)
        if headers is None:  # not a mapping, or one that cannot be read: replaced
            self.counters.incr("rejected:headers")
            reported = self._bad_headers_reported
            if task not in reported and len(reported) < _REPORT_LIMIT:  # once per task name
                reported.add(task)
                logger.warning("aitp: %s: ignoring headers= that is not a readable mapping "
                               "(counted as rejected:headers)", task)
            headers = {}
        options["headers"] = headers
        return headers


def caller_headers(raw: Any) -> dict[str, Any] | None:
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


def _drop_destination(options: dict[str, Any]) -> None:
    for key in ("exchange", "routing_key", "exchange_type"):
        options.pop(key, None)
