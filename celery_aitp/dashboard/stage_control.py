"""The dashboard's only write: replace the live stage document, with an audit entry.

The document is validated exactly as a policy file is (the stage must be a Stage, the
split must be valid SplitSettings naming known tenants and tiers), then written with the
same store call the command line uses, ``RedisStore.write_stage(doc, who)``. Deciding
what a stage means stays in the publish pipeline.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery_aitp.errors import PolicyError
from celery_aitp.policy import Policy, parse_policy
from celery_aitp.store import RedisStore


def validated_stage_doc(policy: Policy, body: Any) -> dict[str, Any]:
    """``{"stage": ..., "split": {...}}`` checked against the policy; PolicyError if bad."""
    if not isinstance(body, Mapping):
        raise PolicyError("(body): expected a JSON object with 'stage' and optional 'split'")
    unknown = set(body) - {"stage", "split"}
    if unknown:
        raise PolicyError(f"(body): unknown field(s) {', '.join(sorted(unknown))}")
    if "stage" not in body:
        raise PolicyError("stage: required (coexistence, split or takeover)")
    candidate = policy.model_dump(mode="json")
    candidate["stage"] = body["stage"]
    candidate["split"] = body.get("split") or {}
    checked = parse_policy(candidate)  # the policy's own validation, messages by path
    return {"stage": checked.stage.value, "split": checked.split.model_dump(mode="json")}


def change_stage(store: RedisStore, policy: Policy, body: Any, who: str) -> dict[str, Any]:
    """Validate and write; returns the new and the previous document."""
    doc = validated_stage_doc(policy, body)
    old = store.write_stage(doc, who=who)
    return {"stage": doc, "previous": old}
