"""Policy sections for the priority matrix, fair share and resource profiles.

Kept apart from :mod:`celery_aitp.policy` so the main policy stays readable; every field
here is validated once at start-up and documented in docs/configuration.md (the
policy reference) and docs/placement.md (how each field is used).
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: Factor names of the priority matrix, in the order ``explain`` shows them.
FACTORS = ("tenant", "sla", "impact", "resources", "runtime", "age")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class TierOrder(str, Enum):
    """How an AITP worker on Redis picks the next queue to read."""

    WEIGHTED = "weighted"  # tiers in order, lower tiers guaranteed a share (no starvation)
    STRICT = "strict"  # always the highest non-empty tier (lower tiers may starve)


class AgingSettings(_Section):
    """RabbitMQ aging: how often waiting messages are looked at, and how many per queue.

    The per-tier promotion age is ``tiers[].promote_after_s``; see ``worker/aging.py``.
    """

    interval_s: float = Field(default=2.0, gt=0, le=3600,
                              description="Seconds between aging passes (one process at a time).")
    max_inspect: int = Field(
        default=200, ge=1, le=100_000,
        description="Messages taken per broker queue per pass, in delivery order (highest "
                    "priority first); a message behind more than this many is not reached.")


class PriorityWeights(_Section):
    """Weight of each normalised factor in the score (all factors are in [0, 1])."""

    tenant: float = Field(default=2.0, ge=0, le=1000,
                          description="The tenant's standing (its max_tier, highest = 1).")
    sla: float = Field(default=4.0, ge=0, le=1000,
                       description="Tightness of the task's SLA target (declared tier, tenant).")
    impact: float = Field(default=2.0, ge=0, le=1000,
                          description="Business impact from labels or a declared impact.")
    resources: float = Field(default=0.5, ge=0, le=1000,
                             description="Resource demand (accelerator, memory, cores).")
    runtime: float = Field(default=1.0, ge=0, le=1000,
                           description="Shortness of the predicted runtime (upper quantile).")
    age: float = Field(default=1.0, ge=0, le=1000,
                       description="Time since the task was first published (retries).")

    @model_validator(mode="after")
    def _some_weight(self) -> PriorityWeights:
        if sum(getattr(self, name) for name in FACTORS) <= 0:
            raise ValueError("at least one priority weight must be positive")
        return self


class PrioritySettings(_Section):
    """The priority matrix: score = sum(weight * factor) / sum(weight), in [0, 1]."""

    weights: PriorityWeights = Field(default_factory=PriorityWeights,
                                     description="Weight of each factor.")
    runtime_min_s: float = Field(default=0.1, gt=0,
                                 description="Runtimes at or below this score 1 (shortest).")
    runtime_max_s: float = Field(default=3600.0, gt=0,
                                 description="Runtimes at or above this score 0 (longest).")
    max_age_s: float = Field(default=600.0, gt=0,
                             description="Age at which the age factor reaches 1.")
    memory_scale_mb: float = Field(default=4096.0, gt=0,
                                   description="Memory target that counts as full demand.")
    cpu_scale_cores: float = Field(default=4.0, gt=0,
                                   description="CPU cores that count as full demand.")
    favor_small: bool = Field(default=False,
                              description="Invert the resources factor: light tasks first.")
    header_labels: bool = Field(default=True,
                                description="Accept business-impact labels from aitp_labels.")

    @model_validator(mode="after")
    def _ranges(self) -> PrioritySettings:
        if self.runtime_max_s <= self.runtime_min_s:
            raise ValueError("runtime_max_s must be greater than runtime_min_s")
        return self


class FairShareSettings(_Section):
    """Per-tenant usage with exponential decay; over-share tenants drop one tier."""

    enabled: bool = Field(default=True, description="Demote tenants above their fair share.")
    half_life_s: float = Field(default=900.0, gt=0, le=30 * 86400,
                               description="Half-life of the usage that fair share compares.")
    tolerance: float = Field(default=0.1, ge=0, le=10,
                             description="Demote only above fair share * (1 + tolerance).")
    default_cost_s: float = Field(default=1.0, gt=0,
                                  description="Usage charged per task without a prediction.")
    min_active_share: float = Field(
        default=0.01, ge=0, lt=1,
        description="Tenants below this share of all usage do not count as active.")


class ProfileFloors(_Section):
    """Smallest targets a profile reports (VPA-style floors)."""

    cpu_s: float = Field(default=0.001, ge=0, description="CPU seconds per run.")
    cpu_cores: float = Field(default=0.025, ge=0, description="Average cores used.")
    memory_mb: float = Field(default=16.0, ge=0, description="Peak memory in MB.")


class ProfileSettings(_Section):
    """Resource profiles learnt from observed runs, per task name."""

    half_life_s: float = Field(default=86400.0, gt=0, le=365 * 86400,
                               description="Half-life of the decaying histograms.")
    target_percentile: float = Field(default=0.9, gt=0, lt=1,
                                     description="Percentile of observed runs the target is.")
    margin: float = Field(default=0.15, ge=0, le=10,
                          description="Safety margin added on top of the percentile.")
    min_samples: int = Field(default=3, ge=1, le=10_000,
                             description="Observed runs needed before a profile is used.")
    floors: ProfileFloors = Field(default_factory=ProfileFloors, description="Floors.")
    infer_accelerator_share: float = Field(
        default=0.5, gt=0, le=1,
        description="Share of runs that must use an accelerator class to infer it.")
    max_tasks: int = Field(default=10_000, ge=1, le=1_000_000,
                           description="Task names profiled at most (bounded storage).")
