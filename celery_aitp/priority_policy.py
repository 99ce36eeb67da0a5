"""Policy sections for the priority matrix, fair share and resource profiles.

Kept apart from :mod:`celery_aitp.policy` so the main policy stays readable; every field
here is validated once at start-up and documented in docs/configuration.md (the
policy reference) and docs/placement.md (how each field is used).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: Factors of a task's urgency, in the order ``explain`` shows them. The runtime is not
#: one of them: it places a task by itself (tiers are size classes, see ``placement``).
FACTORS = ("tenant", "sla", "impact", "resources", "age")
URGENCY_FACTORS = FACTORS


def _takes_a_number(annotation: Any) -> bool:
    """Whether a field is a number (``float``, ``int``, or either or None)."""
    kinds = typing.get_args(annotation) if isinstance(annotation, types.UnionType) or \
        typing.get_origin(annotation) is typing.Union else (annotation,)
    return any(kind in (float, int) for kind in kinds)


class NumbersAreNumbers(BaseModel):
    """A number field takes a number, not a boolean or a string: pydantic's lax mode read
    ``weight: true`` as 1 and ``weight: "3"`` as 3, and a policy with either validated."""

    @model_validator(mode="before")
    @classmethod
    def _numbers_are_numbers(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            for name, field in cls.model_fields.items():
                value = data.get(name)
                if isinstance(value, (bool, str)) and _takes_a_number(field.annotation):
                    raise ValueError(f"{name}: {value!r} is not a number")
        return data


class _Section(NumbersAreNumbers):
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
                           description="Ignored since tiers became size classes (the "
                                       "predicted runtime places a task by itself); kept so "
                                       "existing policies load.")
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
                                 description="Ignored since tiers became size classes.")
    runtime_max_s: float = Field(default=3600.0, gt=0,
                                 description="Ignored since tiers became size classes.")
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


class PlacementSettings(_Section):
    """Tiers as size classes (``scheduling/size_classes.py``): short work goes first."""

    window_tasks: float = Field(
        default=1000.0, ge=10, le=10_000_000,
        description="Half-life, in placed tasks, of the recent effective sizes the tier "
                    "boundaries follow: counted in tasks, not seconds, so the window holds "
                    "the same mix at ten tasks a second or one an hour.")
    load: float = Field(
        default=0.95, gt=0, lt=1,
        description="Utilisation the boundaries are tuned for (they matter under load).")
    min_gain: float = Field(
        default=0.05, ge=0, le=1,
        description="Move the boundaries only when the new ones promise at least this much "
                    "less mean slowdown (keeps tiers steady under a steady mix).")
    split_gain: float = Field(
        default=0.2, ge=0, le=10,
        description="How much less mean slowdown one more tier must promise for the "
                    "boundaries to use it (0: every tier that lowers it).")
    min_size_ratio: float = Field(
        default=1.0, ge=1, le=1000,
        description="How many times longer, on average, a tier's tasks must run than the "
                    "tier above's for the boundaries to split them (1: any split; with "
                    "split_gain 0, 2 keeps a narrow mix in one tier, since predictions "
                    "err by more than its sizes differ).")
    urgency_range: float = Field(
        default=10.0, ge=1, le=1e6,
        description="How much shorter a task of the highest urgency (tenant, SLA, impact, "
                    "resources, age) counts than one of the lowest.")
    size_quantile: float = Field(
        default=0.5, ge=0.5, le=0.9,
        description="Quantile of a model's predicted runtime a task is ranked by (the "
                    "median, or up to the p90: between them, on the log-normal through "
                    "both). The median gives the lowest expected mean slowdown; a higher "
                    "one ranks a task with an uncertain prediction as a longer one.")
    min_samples: float = Field(
        default=20.0, ge=1,
        description="Recent sizes an accelerator class needs before its boundaries are "
                    "used; until then its tasks take the lowest tier (no size order).")
    refresh_s: float = Field(
        default=2.0, gt=0, le=3600,
        description="Seconds between two reads of the shared histogram.")


class ReserveSettings(_Section):
    """Processes an AITP worker keeps for its higher tiers (``worker/reserve.py``; Redis)."""

    processes: int = Field(
        default=1, ge=0, le=1024,
        description="Processes of each worker (with at least this many + 2) that long "
                    "work (lowest-tier tasks, and runs that lasted as long) may not all "
                    "hold while higher tiers have work; 0 "
                    "turns the reserve off.")
    max_wait_runs: float = Field(
        default=1.5, gt=0, le=1000,
        description="A lowest-tier task that has waited this many mean lowest-tier runs "
                    "(as the worker timed them; the fleet's until it has) may take a kept "
                    "process and is read "
                    "before the higher tiers: the reserve's starvation bound.")


class FeedbackSettings(_Section):
    """Tenants that miss their SLAs get a bounded boost (``scheduling/feedback.py``)."""

    enabled: bool = Field(default=True, description="Adjust boosts from observed waits.")
    window_s: float = Field(
        default=60.0, gt=0, le=86_400,
        description="Half-life of the observed waits the miss rates are computed from.")
    max_miss_rate: float = Field(
        default=0.05, gt=0, lt=1,
        description="Share of a tenant's runs that may wait longer than their SLA; above "
                    "it the tenant's boost doubles, below half of it the boost halves.")
    max_boost: float = Field(
        default=8.0, ge=1, le=1024,
        description="Largest boost: a boosted tenant's tasks count this many times shorter.")
    min_runs: float = Field(
        default=20.0, ge=1,
        description="Recent runs a tenant needs before its miss rate moves its boost.")


class SpillSettings(_Section):
    """Send a task to Celery's default queue when its tier queue is saturated and a
    standard worker is idle (``scheduling/spill.py``)."""

    enabled: bool = Field(default=True, description="Spill saturated tiers to idle "
                                                    "standard workers.")
    min_backlog: float = Field(
        default=1.0, gt=0, le=1_000_000,
        description="Waiting tasks per serving slot at which a tier queue starts spilling.")
    release: float = Field(
        default=0.5, ge=0, lt=1,
        description="A spilling queue stops once its backlog per slot falls to this share "
                    "of min_backlog (hysteresis).")
    sla_margin: float = Field(
        default=1.0, gt=0, le=100,
        description="Spill a task whose expected wait exceeds this many times its SLA.")
    max_fraction: float = Field(
        default=0.5, gt=0, le=1,
        description="Largest share of a saturated queue's tasks that may spill.")
    min_idle_slots: int = Field(
        default=1, ge=1, le=1_000_000,
        description="Idle slots the standard workers need before anything spills to them.")
    alternatives: dict[str, tuple[str, ...]] = Field(
        default_factory=dict,
        description="Accelerator class -> other classes its tasks can run on, tried in "
                    "order (the same tenant and tier) before the default queue.")
    report_interval_s: float = Field(
        default=1.0, gt=0, le=3600,
        description="Seconds between two occupancy reports of a worker (slots, busy, "
                    "queue depths).")
    max_report_age_s: float = Field(
        default=5.0, gt=0, le=86_400,
        description="Occupancy reports older than this are ignored.")


class FairShareSettings(_Section):
    """Per-tenant usage with exponential decay; over-share tenants drop one tier."""

    enabled: bool = Field(default=True, description="Demote tenants above their fair share.")
    half_life_s: float = Field(default=900.0, gt=0, le=30 * 86400,
                               description="Half-life of the usage that fair share compares.")
    tolerance: float = Field(
        default=0.5, ge=0, le=10,
        description="Demote only above fair share * (1 + tolerance). Wide enough that "
                    "equal tenants are not demoted by chance (who drew the longer tasks "
                    "lately), which reorders their tasks for no gain.")
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
