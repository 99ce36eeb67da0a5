"""The data behind each page, as JSON-safe dicts (pure functions of a Snapshot).

The HTML pages and the ``/api/...`` endpoints serve exactly these payloads, so a script
reads what an operator sees. Missing fields in older records are skipped, never fatal.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from celery_aitp.core.request import decision_outcome
from celery_aitp.dashboard import shares as work
from celery_aitp.dashboard.fleet import Snapshot
from celery_aitp.dashboard.stats import number, percentile, prediction_errors, summary
from celery_aitp.numbers import skewed_wait
from celery_aitp.policy import Policy

MAX_POINTS = 500


def parse_decision_key(key: str) -> dict[str, str] | None:
    """``decisions:<stage>:<tenant>:<tier>:<accelerator>:<reason>`` (the reason may hold ':')."""
    parts = key.split(":", 5)
    if len(parts) != 6 or parts[0] != "decisions":
        return None
    _, stage, tenant, tier, accelerator, reason = parts
    return {"stage": stage, "tenant": tenant, "tier": tier, "accelerator": accelerator,
            "reason": reason}


def decision_breakdown(counts: Mapping[str, int]) -> dict[str, Any]:
    """Routed and fallback totals and the share of each reason."""
    by_reason: Counter[str] = Counter()
    for key, n in counts.items():
        parsed = parse_decision_key(key)
        if parsed is not None and n > 0:
            by_reason[parsed["reason"]] += n
    total = sum(by_reason.values())
    outcomes: Counter[str] = Counter()
    for reason, n in by_reason.items():
        outcomes[decision_outcome(reason)] += n
    routed = outcomes["routed"]
    reasons = [
        {"reason": reason, "count": n, "share": n / total if total else 0.0,
         "routed": reason == "routed", "error": reason.startswith("error:")}
        for reason, n in by_reason.most_common()
    ]
    return {"total": total, "routed": routed, "explicit": outcomes["explicit"],
            "fallback": outcomes["fallback"],
            "routed_share": routed / total if total else None, "reasons": reasons}


def sla_by_tier(policy: Policy, records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Share of runs per tier whose queue wait met the tier's SLA. A wait negative
    beyond the tolerance is clock skew (the producer ahead of the worker): unknown, not
    a hit, and counted in ``clock_skew``."""
    waits: dict[str, list[float]] = defaultdict(list)
    skewed: Counter[str] = Counter()
    for r in records:
        wait = number(r.get("wait_s"))
        if wait is not None and isinstance(r.get("tier"), str):
            if skewed_wait(wait):
                skewed[r["tier"]] += 1
            else:
                waits[r["tier"]].append(wait)
    rows = []
    for tier in policy.tiers:
        values = waits.get(tier.name, [])
        hits = sum(1 for w in values if w <= tier.sla_s)
        rows.append({"tier": tier.name, "sla_s": tier.sla_s, "n": len(values), "hits": hits,
                     "hit_rate": hits / len(values) if values else None,
                     # what the tier's tasks really waited: with loose SLAs every tier
                     # meets its own, and the hit rate alone says nothing
                     "wait_p95_s": percentile(sorted(values), 95),
                     "clock_skew": skewed[tier.name]})
    return rows


def _alive(worker: Mapping[str, Any], now: float, ttl_s: float) -> bool:
    return now - float(worker.get("heartbeat") or 0) <= ttl_s


def overview(snap: Snapshot, policy: Policy, ttl_s: float) -> dict[str, Any]:
    history = snap.stage_history[0] if snap.stage_history else None
    events = {k: n for k, n in snap.counters.items() if not k.startswith("decisions:")}
    depths = [q["depth"] for q in snap.queues if isinstance(q.get("depth"), int)]
    return {
        "at": snap.at,
        "health": _health(snap),
        "stage": {"stage": snap.stage, "split": snap.split,
                  "changed_at": history.get("at") if history else None,
                  "changed_by": history.get("who") if history else None},
        "decisions_per_s": snap.decisions_per_s,
        "rate_history": [{"t": t, "v": v} for t, v in snap.rate_history[-120:]],
        "decisions": {"window": decision_breakdown(snap.window_counters),
                      "total": decision_breakdown(snap.counters)},
        "sla": sla_by_tier(policy, snap.observations),
        "workers": {"alive": sum(_alive(w, snap.workers_read_at, ttl_s)
                             for w in snap.workers),
                    "known": len(snap.workers)},
        "queued": sum(depths) if depths else None,
        "orphaned_queues": [q["queue"] for q in snap.queues if q.get("orphaned")],
        "model": snap.model,
        "events": dict(sorted(events.items())),
    }


def _health(snap: Snapshot) -> dict[str, Any]:
    return {"store_ok": snap.store_ok, "store_error": snap.store_error,
            "store_read_at": snap.store_read_at,
            "broker_ok": snap.broker_ok, "broker_error": snap.broker_error}


#: Rows of the tenants page (and tenant label values of /metrics) at most; the rest are
#: summed into one ``other`` row, so the page stays small with thousands of tenants.
MAX_TENANT_ROWS = 50
OTHER_TENANTS = "other"


def top_tenants(names: list[str], runtime: Mapping[str, float],
                runs: Mapping[str, int]) -> tuple[list[str], list[str]]:
    """(tenants shown, tenants summed into ``other``): all of them up to
    ``MAX_TENANT_ROWS``, else the busiest by runtime then runs, in their original order."""
    if len(names) <= MAX_TENANT_ROWS:
        return names, []
    busiest = sorted(names, key=lambda t: (-runtime.get(t, 0.0), -runs.get(t, 0)))
    shown = set(busiest[:MAX_TENANT_ROWS - 1])
    return [t for t in names if t in shown], [t for t in names if t not in shown]


def other_tenants_row(names: list[str], runs: Mapping[str, int], runtime: Mapping[str, float],
                      shares: Mapping[str, float], fair: Mapping[str, float | None],
                      tiers: tuple[str, ...],
                      waits: Mapping[str, Mapping[str, list[float]]]) -> dict[str, Any]:
    """The tenants beyond the top rows, summed (their waits pooled per tier)."""
    return {
        "tenant": OTHER_TENANTS, "known": False, "weight": None, "max_tier": None,
        "tenants": len(names), "runs": sum(runs.get(t, 0) for t in names),
        "runtime_s": sum(runtime.get(t, 0.0) for t in names),
        "share": sum(shares.get(t, 0.0) for t in names),
        "fair_share": sum(fair.get(t) or 0.0 for t in names),
        "wait": {tier: summary([w for t in names for w in waits.get(t, {}).get(tier, [])])
                 for tier in tiers},
    }


def tenants(snap: Snapshot, policy: Policy, window_s: float) -> dict[str, Any]:
    runtime: dict[str, float] = defaultdict(float)
    runs: Counter[str] = Counter()
    waits: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in snap.observations:
        tenant = r.get("tenant")
        if not isinstance(tenant, str) or not tenant:
            continue
        runs[tenant] += 1
        runtime[tenant] += max(0.0, number(r.get("runtime_s")) or 0.0)
        wait = number(r.get("wait_s"))
        if wait is not None and isinstance(r.get("tier"), str):
            waits[tenant][r["tier"]].append(wait)
    active = [t for t in runtime if runtime[t] > 0]
    weights = {name: spec.weight for name, spec in policy.tenants.items()}
    for name in active:
        spec = policy.tenant_spec(name) if name not in weights else None
        if spec is not None:  # an unlisted tenant of a class: the class's weight
            weights[name] = spec.weight
    shares = work.work_shares(runtime)
    fair = work.fair_shares(weights, active)
    scheduler = snap.fair_share
    rows = []
    names = list(policy.tenants) + sorted(set(runs) - set(policy.tenants))
    names, others = top_tenants(names, runtime, runs)
    for name in names:
        spec = policy.tenant_spec(name)
        rows.append({
            "tenant": name, "known": spec is not None,
            "weight": spec.weight if spec else None,
            "max_tier": (spec.max_tier or policy.tier_names[0]) if spec else None,
            "runs": runs.get(name, 0), "runtime_s": runtime.get(name, 0.0),
            "share": shares.get(name, 0.0), "fair_share": fair.get(name),
            "wait": {tier: summary(waits[name].get(tier, [])) for tier in policy.tier_names},
        })
    if others:
        rows.append(other_tenants_row(others, runs, runtime, shares, fair, policy.tier_names,
                                      waits))
    return {
        "at": snap.at, "window_s": window_s, "tenants": rows, "tiers": list(policy.tier_names),
        # the scheduler's figures (celery_aitp.fairness over decayed usage), not a second
        # formula: what the dashboard shows is what the scheduler acts on
        "fairness_index": number(scheduler.get("jain")),
        "priority_entropy": number(scheduler.get("entropy")),
        "demoted": list(scheduler.get("demoted") or []),
        "decisions_in_window": len(snap.decisions),
    }


#: Queue rows of the queues page (and queue series of /metrics) at most: the default
#: queue, then orphaned and deepest first; the rest summed into one ``other`` row.
MAX_QUEUE_ROWS = 100
OTHER_QUEUES = "other"


def top_queues(rows: list[dict[str, Any]], limit: int = MAX_QUEUE_ROWS
               ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """(rows shown, the rest summed into one row, or None when all are shown)."""
    if len(rows) <= limit:
        return rows, None
    ranked = sorted(rows, key=lambda q: (q.get("kind") != "default", not q.get("orphaned"),
                                         -(q.get("depth") or 0), str(q.get("queue"))))
    shown, rest = ranked[:limit - 1], ranked[limit - 1:]
    ages = [q["oldest_age_s"] for q in rest if isinstance(q.get("oldest_age_s"), (int, float))]
    depths = [q["depth"] for q in rest if isinstance(q.get("depth"), int)]
    other: dict[str, Any] = {
        "queue": OTHER_QUEUES, "kind": "other", "tenant": None, "accelerator": None,
        "tier": None, "queues": len(rest), "depth": sum(depths) if depths else None,
        "oldest_age_s": max(ages) if ages else None, "consumers": [],
        "live": None, "orphaned": any(q.get("orphaned") for q in rest)}
    return shown, other


def queues(snap: Snapshot, default_queue: str) -> dict[str, Any]:
    rows = snap.queues
    depths = [q["depth"] for q in rows if isinstance(q.get("depth"), int)]
    shown, other = top_queues(rows)
    return {"at": snap.at, "health": _health(snap), "default_queue": default_queue,
            "queues": shown + ([other] if other else []),
            "total_depth": sum(depths) if depths else None,
            "orphaned": [q["queue"] for q in rows if q.get("orphaned")][:MAX_QUEUE_ROWS],
            "spill": snap.spill}


def workers(snap: Snapshot, ttl_s: float) -> dict[str, Any]:
    rows = []
    for w in snap.workers:
        heartbeat = number(w.get("heartbeat"))
        rows.append({
            "worker": w.get("worker"), "accelerator": w.get("accelerator"),
            "tenants": list(w.get("tenants") or []), "tiers": list(w.get("tiers") or []),
            "queues": list(w.get("queues") or []), "default_queue": w.get("default_queue"),
            "express": w.get("express") is True, "heartbeat": heartbeat,
            "heartbeat_age_s": None if heartbeat is None else max(0.0, snap.at - heartbeat),
            "alive": _alive(w, snap.workers_read_at, ttl_s),
        })
    return {"at": snap.at, "ttl_s": ttl_s, "workers": rows}


def predictions(snap: Snapshot) -> dict[str, Any]:
    points = []
    for r in snap.observations:
        predicted, actual = number(r.get("predicted_runtime_s")), number(r.get("runtime_s"))
        if predicted is not None and actual is not None:
            points.append({"task": r.get("task"), "tenant": r.get("tenant"),
                           "task_id": r.get("task_id"), "predicted_s": predicted,
                           "actual_s": actual})
    points = points[-MAX_POINTS:]
    errors = prediction_errors(snap.observations)
    by_task = [{"task": task, **e} for task, e in sorted(errors.items(), key=lambda i: -i[1]["n"])]
    n = sum(e["n"] for e in errors.values())
    overall = None if not n else {
        "n": n, "mae_s": sum(e["mae_s"] * e["n"] for e in errors.values()) / n,
        "mre": sum(e["mre"] * e["n"] for e in errors.values()) / n}
    without = sum(1 for r in snap.observations if number(r.get("predicted_runtime_s")) is None)
    return {"at": snap.at, "model": snap.model, "points": points, "by_task": by_task,
            "overall": overall, "runs_without_prediction": without}


def recent_tasks(snap: Snapshot, limit: int = 100, task: str | None = None,
                 tenant: str | None = None) -> dict[str, Any]:
    rows = []
    for d in reversed(snap.decisions):
        if (task and d.get("task") != task) or (tenant and d.get("tenant") != tenant):
            continue
        rows.append({k: d.get(k) for k in ("task_id", "task", "tenant", "tier", "accelerator",
                                           "queue", "routed", "reason", "stage", "decided_at")})
        if len(rows) >= limit:
            break
    return {"at": snap.at, "tasks": rows}
