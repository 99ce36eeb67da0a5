"""One-line descriptions of stages, split settings and audit entries, for every command."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from celery_aitp.policy import SplitSettings, Stage


def describe_split(split: SplitSettings) -> str:
    """``30% of tenant=acme task=billing.*`` (percentages apply within the selection)."""
    selectors = [
        f"{name}={','.join(values)}"
        for name, values in (("tenant", split.tenants), ("task", split.tasks),
                             ("tier", split.tiers))
        if values
    ]
    if split.max_uncertainty is not None:
        selectors.append(f"max_uncertainty={split.max_uncertainty:g}")
    text = f"{split.percent:g}%"
    return f"{text} of {' '.join(selectors)}" if selectors else text


def describe(stage: Stage, split: SplitSettings) -> str:
    """``coexistence``, ``takeover`` or ``split 30% of tenant=acme``."""
    return f"split {describe_split(split)}" if stage is Stage.SPLIT else stage.value


def describe_doc(doc: Mapping[str, Any] | None) -> str:
    """A stored stage document as text; ``(policy default)`` when none was stored."""
    if not doc:
        return "(policy default)"
    try:
        return describe(Stage(doc.get("stage")), SplitSettings.model_validate(
            doc.get("split") or {}))
    except (ValueError, TypeError):
        return f"(malformed: {dict(doc)!r})"


def when(at: Any) -> str:
    """A Unix time as local ``YYYY-mm-dd HH:MM:SS``; empty when absent."""
    if not isinstance(at, (int, float)):
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
