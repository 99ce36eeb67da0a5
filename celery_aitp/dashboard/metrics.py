"""Prometheus exposition of the fleet, every name prefixed ``aitp_``.

The dashboard is the fleet's exporter: producers and workers ship their process-local
counters and records to the store, and this collector turns one Snapshot (plus the
cumulative run totals) into metric families. Every label value is bounded, see
:mod:`labels`; ``METRICS`` lists each family with its labels for the docs and tests.
Names follow Prometheus' conventions: base units, ``_total`` counters, ``_ratio`` for
0-1 shares, ``_timestamp_seconds`` for points in time (alerts compute ages with
``time()``), and no label whose value changes under a running series (the stage is its
own gauge, not a label of the decision counter). ``/metrics`` is served by
prometheus-client's own ASGI app: gzip when asked, OpenMetrics when preferred.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from prometheus_client import make_asgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import CollectorRegistry
from starlette.concurrency import run_in_threadpool

from celery_aitp.core.request import decision_outcome
from celery_aitp.dashboard import pages
from celery_aitp.dashboard.event_counters import EVENT_COUNTERS, event_samples
from celery_aitp.dashboard.fleet import Fleet
from celery_aitp.dashboard.security import ASGIApp, Receive, Scope, Send
from celery_aitp.policy import Stage

#: A queue's labels: its name and kind, and the tenant, accelerator class and tier it holds
#: (``none`` for the default queue; tier ``all`` where one broker queue holds every tier).
QUEUE_LABELS = ("queue", "kind", "tenant", "accelerator", "tier")

#: name -> (type, labels, help). docs/dashboard.md's metrics reference mirrors this table.
METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "aitp_decisions_total": ("counter", ("tenant", "tier", "accelerator", "reason", "outcome"),
                             "Publish-time decisions; outcome is routed or fallback (the "
                             "stage they were made in is aitp_stage)."),
    **{name: ("counter", (family.label,) if family.label else (), family.help)
       for name, family in EVENT_COUNTERS.items()},
    "aitp_queue_depth": ("gauge", QUEUE_LABELS, "Messages waiting in the queue."),
    "aitp_queue_oldest_age_seconds": ("gauge", QUEUE_LABELS,
                                      "Age of the oldest waiting message (0 when empty)."),
    "aitp_queue_consumers": ("gauge", QUEUE_LABELS, "Live AITP workers serving the queue."),
    "aitp_queue_orphaned": ("gauge", ("queue",),
                            "1 when a tier queue holds messages and no live worker serves it."),
    "aitp_queue_wait_seconds": ("histogram", ("tenant", "tier"),
                                "Queue wait of runs seen since this exporter started."),
    "aitp_run_seconds": ("histogram", ("tenant", "tier"),
                         "Run time of runs seen since this exporter started."),
    "aitp_runs_total": ("counter", ("tenant", "tier", "outcome"),
                        "Runs seen since this exporter started, by final state."),
    "aitp_sla_misses_total": ("counter", ("tenant", "tier"),
                              "Runs whose queue wait exceeded their tier's sla_s."),
    "aitp_sla_hit_ratio": ("gauge", ("tier",), "Share of runs in the window that met the SLA."),
    "aitp_prediction_relative_error": ("histogram", ("task",),
                                       "|predicted - actual| / actual run time per run."),
    "aitp_prediction_error_seconds": ("gauge", ("task",),
                                      "Mean absolute prediction error in the window."),
    "aitp_tenant_share_ratio": ("gauge", ("tenant",),
                                "Tenant's share of run time in the window (0-1)."),
    "aitp_tenant_fair_share_ratio": ("gauge", ("tenant",), "Weight over the weights of the "
                                     "tenants active in the window (0-1)."),
    "aitp_fairness_index": ("gauge", (), "Jain's index of served work (the scheduler's, 0-1)."),
    "aitp_priority_entropy": ("gauge", (), "Normalised entropy of the tier distribution (0-1)."),
    "aitp_model_info": ("info", ("version",), "The runtime model version in the store."),
    "aitp_model_loaded": ("gauge", (), "1 when a trained model is in the store, 0 in cold start."),
    "aitp_model_trained_timestamp_seconds": ("gauge", (), "When the model in the store was "
                                             "trained, Unix time (if its metadata says)."),
    "aitp_stage": ("gauge", ("stage",), "1 for the live migration stage, 0 for the others."),
    "aitp_split_ratio": ("gauge", (), "Share of traffic the split stage routes (0-1)."),
    "aitp_workers": ("gauge", ("accelerator",), "Live AITP workers by accelerator class."),
    "aitp_store_up": ("gauge", (), "1 when the shared store answered the last read."),
    "aitp_broker_up": ("gauge", (), "1 when the broker answered the last depth read."),
}


def family_name(name: str) -> str:
    """The family's name in the Prometheus text format (a counter's without ``_total``)."""
    return name.removesuffix("_total") if METRICS[name][0] == "counter" else name


def _family(name: str) -> Metric:
    kind, labels, doc = METRICS[name]
    if kind == "counter":
        return CounterMetricFamily(name.removesuffix("_total"), doc, labels=labels)
    if kind == "histogram":
        return HistogramMetricFamily(name, doc, labels=labels)
    if kind == "info":  # the text format shows it as a gauge of 1, OpenMetrics as an info
        return InfoMetricFamily(name.removesuffix("_info"), doc, labels=labels)
    return GaugeMetricFamily(name, doc, labels=labels)


class FleetCollector:
    """A prometheus_client collector reading one Fleet."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        #: The window's samples for the last snapshot: scrapes between two refreshes of
        #: the snapshot reuse them (the window pages read every record in the window).
        self._window_cache: tuple[Any, list[tuple[str, tuple[str, ...], float]]] = (None, [])

    def describe(self) -> list[Metric]:
        """Every family, empty: the registry learns the names, so ``?name[]=`` filters."""
        return [_family(name) for name in METRICS]

    def collect(self) -> Iterator[Metric]:
        fleet = self.fleet
        snap = fleet.snapshot()
        fams: dict[str, Any] = {name: _family(name) for name in METRICS}
        self._decisions(fams, snap.counters)
        self._queues(fams, snap.queues)
        self._runs(fams)
        cached_for, samples = self._window_cache
        if cached_for is not snap:
            window = {name: _family(name) for name in METRICS}
            self._window(window, snap)
            samples = [(name, tuple(sample.labels.values()), sample.value)
                       for name, family in window.items() for sample in family.samples]
            self._window_cache = (snap, samples)
        for name, labels, value in samples:
            fams[name].add_metric(labels, value)
        self._state(fams, snap)
        yield from fams.values()

    def _decisions(self, fams: dict[str, Any], counts: dict[str, int]) -> None:
        b = self.fleet.bounds
        decisions: Counter[tuple[str, ...]] = Counter()
        others: dict[str, int] = {}
        for key, n in counts.items():
            parsed = pages.parse_decision_key(key)
            if parsed is None:
                others[key] = n
                continue
            reason = b.free("reason", parsed["reason"])
            decisions[(b.tenant(parsed["tenant"]), b.tier(parsed["tier"]),
                       b.accelerator(parsed["accelerator"]), reason,
                       decision_outcome(parsed["reason"]))] += n
        for labels, n in sorted(decisions.items()):
            fams["aitp_decisions_total"].add_metric(labels, n)
        for name, series in event_samples(others, b).items():
            for labels, n in sorted(series.items()):
                fams[name].add_metric(labels, n)

    def _queues(self, fams: dict[str, Any], rows: list[dict[str, Any]]) -> None:
        b = self.fleet.bounds
        shown, other = pages.top_queues(rows)  # bounded: the rest in one 'other' series
        for q in shown + ([other] if other else []):
            if q.get("depth") is None:
                continue
            labels = b.queue_labels(q) if q is not other else (pages.OTHER_QUEUES,) * 5
            fams["aitp_queue_depth"].add_metric(labels, q["depth"])
            fams["aitp_queue_oldest_age_seconds"].add_metric(labels, q.get("oldest_age_s") or 0.0)
            fams["aitp_queue_consumers"].add_metric(labels, len(q.get("consumers") or ()))
            if q["kind"] == "tier" or q is other:
                fams["aitp_queue_orphaned"].add_metric((q["queue"],), 1.0 if q["orphaned"] else 0.0)

    def _runs(self, fams: dict[str, Any]) -> None:
        state = self.fleet.totals.copy_state()
        for name, part in (("aitp_queue_wait_seconds", "wait"), ("aitp_run_seconds", "run"),
                           ("aitp_prediction_relative_error", "prediction_error")):
            for labels, (buckets, total) in sorted(state[part].items()):
                fams[name].add_metric(labels, buckets, total)
        misses = state["sla_misses"]
        for labels in sorted(set(misses) | set(state["wait"])):  # zeros too, for ratios
            fams["aitp_sla_misses_total"].add_metric(labels, misses.get(labels, 0))
        for labels, n in sorted(state["runs"].items()):
            fams["aitp_runs_total"].add_metric(labels, n)

    def _window(self, fams: dict[str, Any], snap: Any) -> None:
        fleet, b = self.fleet, self.fleet.bounds
        for row in pages.sla_by_tier(fleet.policy, snap.observations):
            if row["hit_rate"] is not None:
                fams["aitp_sla_hit_ratio"].add_metric((row["tier"],), row["hit_rate"])
        errors: dict[str, list[tuple[int, float]]] = {}
        for row in pages.predictions(snap)["by_task"]:
            errors.setdefault(b.task(row["task"]), []).append((row["n"], row["mae_s"]))
        for task, items in sorted(errors.items()):
            n = sum(i[0] for i in items)
            fams["aitp_prediction_error_seconds"].add_metric(
                (task,), sum(k * v for k, v in items) / n)
        ten = pages.tenants(snap, fleet.policy, fleet.window_s)
        share: dict[str, float] = {}
        fair: dict[str, float] = {}
        for row in ten["tenants"]:  # at most MAX_TENANT_ROWS, the rest in one 'other' row
            if row["known"] or row["tenant"] == pages.OTHER_TENANTS:
                label = b.tenant(row["tenant"])
                share[label] = share.get(label, 0.0) + row["share"]
                fair[label] = fair.get(label, 0.0) + (row["fair_share"] or 0.0)
        for label in share:
            fams["aitp_tenant_share_ratio"].add_metric((label,), share[label])
            fams["aitp_tenant_fair_share_ratio"].add_metric((label,), fair[label])
        if ten["fairness_index"] is not None:
            fams["aitp_fairness_index"].add_metric((), ten["fairness_index"])
        if ten["priority_entropy"] is not None:
            fams["aitp_priority_entropy"].add_metric((), ten["priority_entropy"])

    def _state(self, fams: dict[str, Any], snap: Any) -> None:
        fleet, b = self.fleet, self.fleet.bounds
        model = snap.model or {}
        if model.get("version"):
            fams["aitp_model_info"].add_metric((str(model["version"])[:64],), {})
        fams["aitp_model_loaded"].add_metric((), 1.0 if model.get("loaded") else 0.0)
        if model.get("trained_at") is not None:
            fams["aitp_model_trained_timestamp_seconds"].add_metric((), model["trained_at"])
        for stage in Stage:
            fams["aitp_stage"].add_metric((stage.value,), 1.0 if snap.stage == stage.value else 0.0)
        percent = float(snap.split.get("percent") or 0.0)
        fams["aitp_split_ratio"].add_metric((), percent / 100.0)
        alive: Counter[str] = Counter()
        for w in pages.workers(snap, fleet.worker_ttl_s)["workers"]:
            if w["alive"]:
                alive[b.accelerator(w["accelerator"])] += 1
        for accelerator in sorted(set(fleet.policy.accelerators) | set(alive)):
            fams["aitp_workers"].add_metric((accelerator,), alive.get(accelerator, 0))
        fams["aitp_store_up"].add_metric((), 1.0 if snap.store_ok else 0.0)
        fams["aitp_broker_up"].add_metric((), 1.0 if snap.broker_ok else 0.0)


def registry_for(fleet: Fleet) -> CollectorRegistry:
    """A private registry holding only the fleet collector (no process metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(fleet))
    return registry


class MetricsApp:
    """``GET /metrics``: prometheus-client's ASGI app over the fleet's registry.

    The snapshot is refreshed in the thread pool first (it reads the store and the
    broker), so the exposition itself, which runs on the event loop, finds it cached.
    """

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.app: ASGIApp = make_asgi_app(registry_for(fleet))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await run_in_threadpool(self.fleet.snapshot)
        await self.app(scope, receive, send)
