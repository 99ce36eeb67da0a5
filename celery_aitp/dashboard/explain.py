"""The explain breakdown of one task: what was decided, from what, and how it went.

Built from the task's decision record (header fields plus ``factors``, ``profile``,
``prediction_source``) and, when it has run, its observation. Priority factors may be
plain numbers or ``{"value"|"contribution": ...}`` mappings; anything else is shown as
text rather than dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery_aitp.dashboard.stats import number
from celery_aitp.policy import Policy

DECISION_FIELDS = ("task", "task_id", "tenant", "tier", "accelerator", "queue", "routed",
                   "reason", "stage", "arm", "score", "decided_at", "v")


def factor_rows(factors: Any) -> list[dict[str, Any]]:
    """``[{name, value, detail}]``, largest magnitude first; numbers only in ``value``."""
    if not isinstance(factors, Mapping):
        return []
    rows = []
    for name, raw in factors.items():
        value = number(raw)
        detail: Any = None
        if value is None and isinstance(raw, Mapping):
            for key in ("contribution", "value", "score"):
                value = number(raw.get(key))
                if value is not None:
                    break
            detail = {str(k): v for k, v in raw.items()}
        elif value is None:
            detail = str(raw)
        rows.append({"name": str(name), "value": value, "detail": detail})
    return sorted(rows, key=lambda r: -abs(r["value"]) if r["value"] is not None else 0.0)


def explain(task_id: str, decision: Mapping[str, Any] | None,
            observation: Mapping[str, Any] | None, policy: Policy) -> dict[str, Any]:
    """The task page's payload; ``found`` is False when neither record exists."""
    d = dict(decision or {})
    o = dict(observation or {})
    sla = {t.name: t.sla_s for t in policy.tiers}
    tier = d.get("tier") or o.get("tier")
    predicted = number(d.get("predicted_runtime_s", o.get("predicted_runtime_s")))
    actual = number(o.get("runtime_s"))
    wait = number(o.get("wait_s"))
    tier_sla = sla.get(tier) if isinstance(tier, str) else None
    return {
        "task_id": task_id,
        "found": bool(d or o),
        "decision": {k: d.get(k) for k in DECISION_FIELDS} if d else None,
        "factors": factor_rows(d.get("factors")),
        "score": number(d.get("score")),
        "profile": d.get("profile") if isinstance(d.get("profile"), Mapping) else None,
        "prediction": {
            "predicted_runtime_s": predicted,
            "predicted_p90_s": number(d.get("predicted_p90_s", o.get("predicted_p90_s"))),
            "source": d.get("prediction_source"),
            "actual_runtime_s": actual,
            "error_s": None if predicted is None or actual is None else predicted - actual,
        },
        "run": None if not o else {
            "worker": o.get("worker"), "queue": o.get("queue"), "outcome": o.get("outcome"),
            "wait_s": wait, "runtime_s": actual, "started_at": number(o.get("started_at")),
            "retries": o.get("retries"), "cpu_s": number(o.get("cpu_s")),
            "peak_rss_mb": number(o.get("peak_rss_mb")),
        },
        "sla": {"tier": tier, "sla_s": tier_sla,
                "met": None if wait is None or tier_sla is None else wait <= tier_sla},
    }
