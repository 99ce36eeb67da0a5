"""The task page: the explain breakdown of one task, plus how its run went.

The breakdown itself (factors with weights and contributions, tier steps, profile,
prediction, route) is :func:`celery_aitp.explain.explain`, the same as
``celery aitp explain TASK_ID`` prints; this module only adds the run (from the task's
observation record) and whether it met its tier's SLA.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery_aitp.dashboard.stats import number
from celery_aitp.explain import tier_story
from celery_aitp.numbers import skewed_wait
from celery_aitp.policy import Policy


def task_page(task_id: str, explained: Mapping[str, Any] | None,
              observation: Mapping[str, Any] | None, policy: Policy) -> dict[str, Any]:
    """The task page's payload; ``found`` is False when neither record exists."""
    e = dict(explained or {})
    o = dict(observation or {})
    route = e.get("route") or {}
    prediction = e.get("prediction") or {}
    tier = e.get("tier") or o.get("tier")
    sla = {t.name: t.sla_s for t in policy.tiers}.get(tier) if isinstance(tier, str) else None
    predicted = number(prediction.get("p50_s", o.get("predicted_runtime_s")))
    actual = number(o.get("runtime_s"))
    wait = number(o.get("wait_s"))
    skewed = wait is not None and skewed_wait(wait)  # clock skew: the wait is unknown
    decision = None if not e else {
        "task": e.get("task"), "tenant": e.get("tenant"), "tier": e.get("tier"),
        "accelerator": route.get("accelerator"), "queue": route.get("would_queue"),
        "routed": route.get("routed"), "reason": route.get("reason"),
        "stage": route.get("stage"), "arm": route.get("arm"), "score": e.get("score"),
        "decided_at": e.get("decided_at"), "policy": e.get("policy"),
    }
    return {
        "task_id": task_id,
        "found": bool(e or o),
        "decision": decision,
        "factors": [f for f in e.get("factors") or [] if number(f.get("value")) is not None],
        "score": number(e.get("score")),
        "tier_story": tier_story(e.get("tier_steps"), e.get("tier"),
                                 e.get("tiers") or ()) if e else None,
        "tenant_note": e.get("tenant_note"),
        "min_scores": e.get("min_scores"),
        "profile": e.get("profile") if isinstance(e.get("profile"), Mapping) else None,
        "note": e.get("note"),
        "prediction": {
            "predicted_runtime_s": predicted,
            "predicted_p90_s": number(prediction.get("p90_s", o.get("predicted_p90_s"))),
            "source": prediction.get("source"),
            "actual_runtime_s": actual,
            "error_s": None if predicted is None or actual is None else predicted - actual,
        },
        "run": None if not o else {
            "worker": o.get("worker"), "queue": o.get("queue"), "outcome": o.get("outcome"),
            "wait_s": wait, "runtime_s": actual, "started_at": number(o.get("started_at")),
            "retries": o.get("retries"), "cpu_s": number(o.get("cpu_s")),
            "peak_rss_mb": number(o.get("peak_rss_mb")),
        },
        "sla": {"tier": tier, "sla_s": sla,
                "met": None if wait is None or sla is None or skewed else wait <= sla,
                "clock_skew": skewed},
    }
