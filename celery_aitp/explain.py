"""Why a task went where it went: a decision record turned into a readable breakdown.

Pure: takes the record (from :class:`celery_aitp.store.decision_log.DecisionLog`) and the
policy that decided it (from the policy history by the record's digest; else the active
policy, with a note), returns plain data for the CLI, the dashboard or JSON.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from celery_aitp.errors import PolicyError
from celery_aitp.policy import Policy, parse_policy
from celery_aitp.priority_policy import FACTORS

#: How many policy changes are searched for the policy that made a decision.
HISTORY_SEARCHED = 1000


def policy_for(record: Mapping[str, Any], active: Policy, active_digest: str,
               history: Sequence[Mapping[str, Any]]) -> tuple[Policy, str | None]:
    """The policy that made the decision, and a note when it is not certain."""
    digest = record.get("policy")
    if digest is None:
        return active, "the record has no policy digest: weights of the active policy"
    if digest == active_digest:
        return active, None
    for entry in history:
        if entry.get("digest") == digest and isinstance(entry.get("policy"), dict):
            try:
                return parse_policy(entry["policy"]), None
            except PolicyError:
                break
    return active, (f"decided under policy {digest}, not in the policy history: "
                    "weights of the active policy")


def explain(record: Mapping[str, Any], policy: Policy, note: str | None = None) -> dict[str, Any]:
    """Urgency factors with weights and contributions, the tier steps (size class, floor,
    cap, fair share), profile, prediction, route."""
    weights = {name: float(getattr(policy.priority.weights, name)) for name in FACTORS}
    total = sum(weights.values()) or 1.0
    factors = record.get("factors") or {}
    rows = []
    for name in FACTORS:
        value = factors.get(name)
        weight = weights[name]
        rows.append({
            "factor": name, "value": value, "weight": weight,
            "contribution": (weight * value / total) if isinstance(value, (int, float)) else None,
        })
    return {
        "task": record.get("task"),
        "task_id": record.get("task_id"),
        "tenant": record.get("tenant"),
        "tenant_note": _tenant_note(record.get("notes")),
        "decided_at": record.get("decided_at"),
        "factors": rows,
        "score": record.get("score"),
        "urgency_range": policy.placement.urgency_range,
        "size_quantile": policy.placement.size_quantile,
        "tier": record.get("tier"),
        "tier_steps": record.get("tier_steps"),
        "tiers": list(policy.tier_names),
        "profile": record.get("profile"),
        "prediction": {
            "p50_s": record.get("predicted_runtime_s"),
            "p90_s": record.get("predicted_p90_s"),
            "source": record.get("prediction_source"),
        },
        "route": {
            "queue": record.get("queue") if record.get("routed") else None,
            "would_queue": record.get("queue"),
            "routed": record.get("routed"),
            "reason": record.get("reason"),
            "stage": record.get("stage"),
            "arm": record.get("arm"),
            "accelerator": record.get("accelerator"),
        },
        "policy": record.get("policy"),
        "note": note,
    }


def explain_task(middleware: Any, task_id: str) -> dict[str, Any] | None:
    """The explanation of ``task_id``'s latest recorded decision, or None if none is kept.

    The one lookup the CLI and the dashboard share: the decision log's task-id index, then
    the policy that decided it (by digest, from the policy history). Raises StoreError.
    """
    from celery_aitp.policy_history import policy_history

    record = middleware.decision_log.find(task_id)
    if record is None:
        return None
    history = policy_history(middleware.store, limit=HISTORY_SEARCHED)
    policy, note = policy_for(record, middleware.policy, middleware.policy_digest, history)
    return explain(record, policy, note)


#: What a decision's notes say about its tenant, for ``explain``.
_TENANT_NOTES = {
    "tenant_unknown": "the task named a tenant the policy does not list (or not a valid "
                      "name): counted as the default tenant",
    "tenant_refused": "the task named a tenant whose header is not trusted: counted as "
                      "the default tenant",
}


def _tenant_note(notes: Any) -> str | None:
    if not isinstance(notes, list):
        return None
    return next((_TENANT_NOTES[n] for n in notes if n in _TENANT_NOTES), None)


def tier_ranges(tiers: Sequence[str], bounds: Sequence[float]) -> list[str]:
    """``hi < 0.06 s``, ``0.06 s <= mid < 1.4 s``, ``lo >= 1.4 s``: the sizes each tier
    takes (a tier the boundaries leave empty is left out)."""
    edges = [0.0, *bounds, float("inf")]
    out = []
    for tier, low, high in zip(tiers, edges, edges[1:], strict=False):
        if low >= high:
            continue
        if low <= 0:
            out.append(f"{tier} < {high:.3g} s")
        elif high == float("inf"):
            out.append(f"{tier} >= {low:.3g} s")
        else:
            out.append(f"{low:.3g} s <= {tier} < {high:.3g} s")
    return out


def tier_story(steps: Mapping[str, Any] | None, tier: str | None,
               tiers: Sequence[str] = ()) -> str:
    """One line: how the task's size class became its tier (``tiers``: the policy's,
    highest first, to say which sizes each takes)."""
    if not steps:
        return f"tier {tier}"
    size = steps.get("effective_size_s")
    bounds = steps.get("bounds_s")
    if size is None:
        parts = [f"no size known -> {steps.get('size')}"]
    elif not bounds:
        parts = [f"effective size {_seconds(size)}; no boundaries yet -> {steps.get('size')}"]
    else:
        if tiers and len(bounds) == len(tiers) - 1:
            edges = "; ".join(tier_ranges(tiers, bounds))
        else:
            edges = "boundaries " + ", ".join(_seconds(b) for b in bounds)
        of = f" of {steps['bounds_of']}" if steps.get("bounds_of") else ""
        parts = [f"effective size {_seconds(size)} ({edges}{of}) -> {steps.get('size')}"]
    if isinstance(steps.get("boost"), (int, float)) and steps["boost"] > 1:
        parts.append(f"boosted x{steps['boost']:g} for missed SLAs")
    if steps.get("floor"):
        parts.append(f"declared floor {steps['floor']}")
    parts.append(f"the tenant's max_tier {steps.get('cap')}")
    if steps.get("fair_share"):
        parts.append("above fair share: one tier lower")
    return "; ".join(parts) + f" => {tier}" + spill_story(steps.get("spill"))


def spill_story(spill: Any) -> str:
    """The spill stage's reason, as a clause of the tier story ('' if it did not spill)."""
    if not isinstance(spill, Mapping):
        return ""
    to = spill.get("to", "default queue")
    why = (f"expected wait {_seconds(spill.get('expected_wait_s'))} "
           f"({_num_of(spill.get('backlog_per_slot'))} waiting per slot) > SLA "
           f"{_seconds(spill.get('sla_s'))}")
    if to == "default queue":
        return (f"; spilled to the default queue: {why}, "
                f"{_num_of(spill.get('idle_slots'))} standard slot(s) idle")
    return (f"; spilled to {to} (class {spill.get('to_accelerator')} instead of "
            f"{spill.get('from_accelerator')}): {why}")


def _num_of(value: Any) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) else "?"


def _seconds(value: Any) -> str:
    return f"{value:.3g} s" if isinstance(value, (int, float)) else "?"
