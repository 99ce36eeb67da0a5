"""The fleet's counters other than decisions, each mapped to a named Prometheus counter.

Producers and workers count anomalies and housekeeping in the store's counters hash under
short keys (``tenant_unknown``, ``records_dropped:decisions``, ``rejected:model``, ...).
Each key belongs to one family below, so a dashboard or an alert asks for
``aitp_rejected_inputs_total`` rather than filtering a catch-all by name. A key this
version does not know (a newer producer's) is exported under ``aitp_other_events_total``
rather than dropped; a unit test keeps every key the code writes mapped here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from celery_aitp.dashboard.labels import Bounds

OTHER_EVENTS = "aitp_other_events_total"


@dataclass(frozen=True)
class EventCounter:
    """One counter family: which keys feed it, and the label value each one gets."""

    help: str
    #: The label telling the keys apart ('' for a family fed by one key).
    label: str = ""
    #: Exact key -> label value ('' when the family has no label).
    keys: Mapping[str, str] = field(default_factory=dict)
    #: Keys ``<prefix><value>`` feed the family with ``value`` as the label value.
    prefix: str = ""


#: metric name -> family. The order is the exposition's.
EVENT_COUNTERS: dict[str, EventCounter] = {
    "aitp_tenant_defaulted_total": EventCounter(
        "Tasks given the default tenant: the tenant they named is unknown to the policy, "
        "malformed, or not theirs to claim.",
        "reason", {"tenant_unknown": "unknown", "tenant_invalid": "invalid",
                   "tenant_refused": "refused"}),
    "aitp_inputs_ignored_total": EventCounter(
        "Declared task inputs a decision ignored: an accelerator or tier the policy does "
        "not know, unknown or malformed labels, header labels while header_labels is off.",
        "input", {key: key for key in ("accelerator_unknown", "tier_unknown", "labels_unknown",
                                       "labels_invalid", "labels_ignored")}),
    "aitp_visibility_risks_total": EventCounter(
        "Tasks whose ETA or predicted run time passes the broker's visibility timeout, and "
        "tier runs that outlasted it (exceeded: they may have run twice).",
        "reason", {"visibility_eta": "eta", "visibility_runtime": "runtime",
                   "visibility_exceeded": "exceeded"}),
    "aitp_rejected_inputs_total": EventCounter(
        "Malformed or hostile input refused and replaced by a safe default: headers= that "
        "is not a mapping, a bad stage document, a model that does not load, a bad field "
        "of a worker's aitp header.",
        "input", prefix="rejected:"),
    "aitp_records_dropped_total": EventCounter(
        "Decision or run records dropped because a process's buffer to the store was full.",
        "stream", prefix="records_dropped:"),
    "aitp_errors_total": EventCounter(
        "Errors caught on the way (the task still went on): store reads, counter flushes, "
        "routing a decision, recording a run, a live-view source.",
        "component", {"store_errors": "store", "flush_errors": "flush",
                      "apply_errors": "apply", "observations_failed": "observe"},
        prefix="source_errors:"),
    "aitp_learning_dropped_total": EventCounter(
        "Runs left out of what the scheduler learns from: observations without a usable "
        "task name, full ledgers or histories, profiles trimmed to profiles.max_tasks.",
        "reason", {key: key for key in ("ledger_skipped", "ledger_dropped", "profiles_trimmed",
                                        "history_dropped", "history_pairs_full",
                                        "drift_dropped")}),
    "aitp_prediction_drift_total": EventCounter(
        "Runtime predictions taken from history because the task's live model error "
        "drifted beyond the bound (decisions), and tasks whose error crossed it (workers).",
        "event", {"prediction_drift": "fallback", "prediction_drift_tasks": "crossed"}),
    "aitp_evacuated_messages_total": EventCounter(
        "Messages the janitor moved from tier queues nobody serves to the default queue.",
        keys={"evacuated": ""}),
    "aitp_aging_promoted_total": EventCounter(
        "Messages the RabbitMQ aging pass raised to a higher priority.", keys={"aged": ""}),
    "aitp_aging_inspected_total": EventCounter(
        "Messages the RabbitMQ aging pass looked at.", keys={"aging_inspected": ""}),
    "aitp_aging_unstamped_total": EventCounter(
        "Messages the aging pass could not age: no aitp.decided_at stamp.",
        keys={"aging_no_age": ""}),
    "aitp_reserve_events_total": EventCounter(
        "Lowest-tier tasks that took a process a Redis worker keeps for its higher tiers "
        "(let_go_age: the oldest had waited the longest wait; let_go_backlog: more "
        "waited than the tier may run at once; let_go_unread: its queues could not be "
        "read), or were read first (read_first).",
        "event", prefix="reserve:"),
    "aitp_explicit_priority_total": EventCounter(
        "Tasks that kept Celery's route for a message priority of their own (RabbitMQ, "
        "where a tier queue's priority is the tier).", keys={"explicit_priority": ""}),
    "aitp_policy_changes_total": EventCounter(
        "Processes that switched to the policy applied to the fleet (adopted), or kept "
        "their own because their settings reject it or its tiers differ (refused).", "outcome",
        {"policy_adopted": "adopted", "policy_refused": "refused"}),
    "aitp_clock_skew_runs_total": EventCounter(
        "Runs whose queue wait came out negative beyond 1 s: the producer's clock ahead of "
        "the worker's. Their wait is unknown, neither an SLA hit nor a miss.",
        keys={"clock_skew": ""}),
    OTHER_EVENTS: EventCounter(
        "Fleet counters this dashboard version has no named metric for (a newer producer "
        "or worker wrote them).", "event"),
}


def _index() -> tuple[dict[str, tuple[str, str]], list[tuple[str, str]]]:
    exact: dict[str, tuple[str, str]] = {}
    prefixes: list[tuple[str, str]] = []
    for name, family in EVENT_COUNTERS.items():
        for key, value in family.keys.items():
            exact[key] = (name, value)
        if family.prefix:
            prefixes.append((family.prefix, name))
    return exact, prefixes


_EXACT, _PREFIXES = _index()


def classify(key: str) -> tuple[str, str] | None:
    """(metric name, raw label value) of a counter key; None if no family names it."""
    found = _EXACT.get(key)
    if found is not None:
        return found
    for prefix, name in _PREFIXES:
        if key.startswith(prefix):
            return name, key[len(prefix):]
    return None


def event_samples(counts: Mapping[str, int], bounds: Bounds
                  ) -> dict[str, dict[tuple[str, ...], int]]:
    """metric name -> label values -> count, for every non-decision counter key.

    Label values pass through ``bounds`` (capped length and number of distinct values).
    """
    out: dict[str, dict[tuple[str, ...], int]] = {}
    for key, n in counts.items():
        found = classify(key)
        name, raw = found if found is not None else (OTHER_EVENTS, key)
        family = EVENT_COUNTERS[name]
        labels = (bounds.free(name, raw),) if family.label else ()
        series = out.setdefault(name, {})
        series[labels] = series.get(labels, 0) + n
    return out
