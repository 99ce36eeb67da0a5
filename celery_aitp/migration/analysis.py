"""What the observation records say: prediction error, route differences, per-arm metrics.

Pure functions over observation records (the dicts ``worker/observe.py`` writes), so the
report, the status command and the guard compute the same numbers the same way.
A record's arm is the one its ``aitp`` header carried (intent to treat): a routed-arm
task that fell back still counts on the routed arm, and its fallback is counted.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from celery_aitp.core.request import EXPLICIT_QUEUE
from celery_aitp.numbers import skewed_wait
from celery_aitp.policy import Policy
from celery_aitp.publish.gate_stage import GATED_REASONS
from celery_aitp.publish.spill_stage import SPILL_REASON
from celery_aitp.publish.split import SplitRule

#: Actual runtimes below this count as this much in relative errors (no division by ~0).
REL_ERROR_FLOOR_S = 0.01

Record = Mapping[str, Any]


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def percentile(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


# --- prediction error -------------------------------------------------------------


@dataclass
class ErrorStats:
    """How far predicted runtimes were from the runtimes observed, for one group."""

    n: int
    mean_actual_s: float
    mean_predicted_s: float
    mae_s: float  # mean absolute error
    median_rel_error: float  # median of |predicted - actual| / max(actual, floor)
    bias_s: float  # mean of predicted - actual (> 0: predictions too long)
    p90_coverage: float | None  # share of runs within the predicted p90 (None: no p90)


def relative_error(predicted: float, actual: float) -> float:
    return abs(predicted - actual) / max(actual, REL_ERROR_FLOOR_S)


def error_stats(pairs: list[tuple[float, float, float | None]]) -> ErrorStats | None:
    """Stats over (predicted, actual, predicted_p90) triples; None for no pairs."""
    if not pairs:
        return None
    predicted = [p for p, _, _ in pairs]
    actual = [a for _, a, _ in pairs]
    with_p90 = [(a, p90) for _, a, p90 in pairs if p90 is not None]
    return ErrorStats(
        n=len(pairs),
        mean_actual_s=statistics.fmean(actual),
        mean_predicted_s=statistics.fmean(predicted),
        mae_s=statistics.fmean(abs(p - a) for p, a in zip(predicted, actual, strict=True)),
        median_rel_error=statistics.median(relative_error(p, a) for p, a, _ in pairs),
        bias_s=statistics.fmean(p - a for p, a in zip(predicted, actual, strict=True)),
        p90_coverage=(sum(a <= p90 for a, p90 in with_p90) / len(with_p90)) if with_p90 else None,
    )


def prediction_pair(record: Record) -> tuple[float, float, float | None] | None:
    """(predicted, actual, predicted p90) for a record that has both runtimes."""
    predicted, actual = _num(record.get("predicted_runtime_s")), _num(record.get("runtime_s"))
    if predicted is None or actual is None:
        return None
    return predicted, actual, _num(record.get("predicted_p90_s"))


def prediction_error(records: Iterable[Record],
                     key: Callable[[Record], Any]) -> dict[str, ErrorStats]:
    """Prediction error grouped by ``key(record)`` (e.g. task name, tenant)."""
    groups: dict[str, list[tuple[float, float, float | None]]] = defaultdict(list)
    for record in records:
        pair = prediction_pair(record)
        if pair is not None:
            groups[str(key(record))].append(pair)
    return {name: stats for name, pairs in sorted(groups.items())
            if (stats := error_stats(pairs)) is not None}


# --- where routes would differ ----------------------------------------------------


@dataclass
class RouteDifferences:
    """Tasks that took Celery's route although the middleware would have routed them."""

    standard: int = 0  # runs that took Celery's own route
    differ: int = 0  # of which the middleware would have sent elsewhere
    pairs: Counter[tuple[str, str]] = field(default_factory=Counter)  # (ran on, would go to)

    @property
    def share(self) -> float | None:
        return self.differ / self.standard if self.standard else None


def route_differences(records: Iterable[Record]) -> RouteDifferences:
    out = RouteDifferences()
    for record in records:
        if record.get("routed"):
            continue
        out.standard += 1
        would, ran = record.get("would_queue"), record.get("queue")
        if record.get("reason") in GATED_REASONS and would and would != ran:
            out.differ += 1
            out.pairs[(str(ran), str(would))] += 1
    return out


# --- per-arm metrics --------------------------------------------------------------

#: Routed-arm runs that did not fall back although not placed by the middleware: a spill
#: is placement, and a task someone routed (a retry staying in its tier queue) kept its
#: queue.
KEPT_REASONS = frozenset({SPILL_REASON, EXPLICIT_QUEUE})


@dataclass
class ArmStats:
    """One arm's runs: waits, SLA hits, failures and fallbacks."""

    n: int = 0
    waits: list[float] = field(default_factory=list)
    sla_checked: int = 0
    sla_hits: int = 0
    clock_skew: int = 0  # runs whose wait is negative beyond the tolerance: unknown
    failures: int = 0
    fell_back: int = 0  # arm 'routed' but the task took Celery's route (no worker, ...)
    rel_errors: list[float] = field(default_factory=list)

    def add(self, record: Record, sla_s: float | None) -> None:
        self.n += 1
        wait = _num(record.get("wait_s"))
        if wait is not None and skewed_wait(wait):  # the producer's clock ahead
            self.clock_skew += 1
        elif wait is not None:
            self.waits.append(max(0.0, wait))
            if sla_s is not None:
                self.sla_checked += 1
                self.sla_hits += wait <= sla_s
        if record.get("outcome") == "FAILURE":
            self.failures += 1
        if record.get("arm") == "routed" and not record.get("routed") and \
                record.get("reason") not in KEPT_REASONS:
            self.fell_back += 1
        pair = prediction_pair(record)
        if pair is not None:
            self.rel_errors.append(relative_error(pair[0], pair[1]))

    @property
    def sla_hit_rate(self) -> float | None:
        return self.sla_hits / self.sla_checked if self.sla_checked else None

    @property
    def failure_rate(self) -> float | None:
        return self.failures / self.n if self.n else None

    @property
    def fallback_rate(self) -> float | None:
        return self.fell_back / self.n if self.n else None

    @property
    def prediction_error(self) -> float | None:
        return statistics.median(self.rel_errors) if self.rel_errors else None

    def wait(self, q: float) -> float | None:
        return percentile(self.waits, q)


def arm_stats(records: Iterable[Record], policy: Policy,
              rule: SplitRule | None = None) -> dict[str, ArmStats]:
    """Stats for the ``routed`` and ``standard`` arms of split-stage runs.

    With ``rule``, also ``control``: the standard-arm runs that match the split's
    selectors, i.e. the tasks the routed arm is a random sample of (compare these).
    """
    sla = {t.name: t.sla_s for t in policy.tiers}
    arms: dict[str, ArmStats] = {"routed": ArmStats(), "standard": ArmStats()}
    if rule is not None:
        arms["control"] = ArmStats()
    for record in records:
        arm = record.get("arm")
        if arm not in ("routed", "standard"):
            continue
        sla_s = sla.get(str(record.get("tier")))
        arms[arm].add(record, sla_s)
        if arm == "standard" and rule is not None and rule.selects(
                str(record.get("task")), record.get("tenant"), record.get("tier"),
                _num(record.get("predicted_runtime_s")), _num(record.get("predicted_p90_s"))):
            arms["control"].add(record, sla_s)
    return arms


def takeover_stats(records: Iterable[Record], policy: Policy) -> ArmStats:
    """Takeover-stage runs as one routed arm (intent to treat: a task that fell back still
    counts, and its fallback is counted); runs of other stages are left out."""
    sla = {t.name: t.sla_s for t in policy.tiers}
    stats = ArmStats()
    for record in records:
        if record.get("stage") != "takeover":
            continue
        stats.add({**record, "arm": "routed"}, sla.get(str(record.get("tier"))))
    return stats
