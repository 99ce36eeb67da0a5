"""The urgency factors: each maps what is known about a task to [0, 1].

Higher is more urgent. Logarithmic scales for times, because the difference between a
1 s and a 10 s SLA matters as much as between 60 s and 600 s.

=========  ====================================================================
tenant     ``1 - rank(max_tier) / (tiers - 1)``: 1 for tenants allowed the top tier
sla        ``(ln max_sla - ln sla) / (ln max_sla - ln min_sla)`` over the tiers' SLAs;
           ``sla`` is the tighter of the declared tier's and the tenant's ``sla_s``,
           else the loosest tier's (0)
impact     the highest weight among the task's labels (declared or ``aitp_labels``
           header, only labels of the policy) or its declared ``impact``; 0 without
resources  ``max(accelerator other than the default, memory / memory_scale_mb,
           cores / cpu_scale_cores)`` capped at 1; ``1 - that`` with ``favor_small``
age        ``(now - first publish) / max_age_s`` capped at 1 (retries keep their origin)
=========  ====================================================================
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def clamp01(x: float) -> float:
    return 0.0 if x < 0.0 else 1.0 if x > 1.0 else x


def log_scale(value: float, low: float, high: float) -> float:
    """0 at or below ``low``, 1 at or above ``high``, logarithmic in between."""
    if value <= low:
        return 0.0
    if value >= high:
        return 1.0
    return math.log(value / low) / math.log(high / low)


def tenant_factor(cap_rank: int, tiers: int) -> float:
    return 1.0 if tiers <= 1 else 1.0 - cap_rank / (tiers - 1)


def sla_factor(sla_s: float | None, min_sla: float, max_sla: float) -> float:
    if sla_s is None:
        return 0.0
    if max_sla <= min_sla:
        return 1.0 if sla_s <= min_sla else 0.0
    return 1.0 - log_scale(sla_s, min_sla, max_sla)


def resource_demand(profile: Mapping[str, Any] | None, default_accelerator: str,
                    memory_scale_mb: float, cpu_scale_cores: float) -> float:
    """How much the task needs, in [0, 1] (1: an accelerator, or the full scale)."""
    if not profile:
        return 0.0
    accelerator = profile.get("accelerator")
    demand = 1.0 if accelerator and accelerator != default_accelerator else 0.0
    memory = profile.get("memory_mb")
    if isinstance(memory, (int, float)) and memory > 0:
        demand = max(demand, memory / memory_scale_mb)
    cores = profile.get("cpu_cores")
    if isinstance(cores, (int, float)) and cores > 0:
        demand = max(demand, cores / cpu_scale_cores)
    return clamp01(demand)


def age_factor(age_s: float, max_age_s: float) -> float:
    return clamp01(age_s / max_age_s) if age_s > 0 else 0.0
