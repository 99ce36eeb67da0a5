"""The scheduling policy: tiers, tenants, accelerator classes and the migration stage.

A policy is validated once, at start-up (or by ``celery aitp validate``), so the publish
path can trust it. Every invalid field is reported with its path, e.g.
``tenants.acme.max_tier: unknown tier 'gold' (tiers: hi, mid, lo)``.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from celery_aitp.errors import PolicyError
from celery_aitp.priority_policy import (
    AgingSettings,
    FairShareSettings,
    FeedbackSettings,
    NumbersAreNumbers,
    PlacementSettings,
    PrioritySettings,
    ProfileSettings,
    ReserveSettings,
    SpillSettings,
    TierOrder,
)

#: Names that end up inside queue names: keep them short and broker-safe.
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}\Z")
#: Business-impact label names (they never end up in queue names, but stay tidy).
LABEL_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}\Z")
#: Entries a split selector list may hold (tenants, task patterns, tiers).
MAX_SELECTORS = 1000
#: Default ratio between the read weights of neighbouring tiers (see ``tier_weights``).
TIER_WEIGHT_RATIO = 8.0


class Stage(str, Enum):
    """Migration stage: how much of the traffic the middleware may route."""

    COEXISTENCE = "coexistence"  # shadow: decide, annotate and record, route nothing
    SPLIT = "split"  # route a share or a selected part of the traffic
    TAKEOVER = "takeover"  # route everything; the default queue serves only fallbacks


#: What :data:`NAME_PATTERN` allows, in words (for error and log messages).
NAME_RULE = ("lower-case letters, digits, '_' or '-', at most 32 characters, starting with "
             "a letter or digit")


def _check_name(value: str) -> str:
    if not NAME_PATTERN.match(value):
        raise ValueError(f"{value!r} is not a valid name ({NAME_RULE})")
    return value


class _Model(NumbersAreNumbers):
    # allow_inf_nan: an infinite SLA or a NaN weight would turn every score into NaN
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Tier(_Model):
    """One service tier. Tiers are listed highest first."""

    name: str = Field(description="Queue-name-safe tier name, e.g. 'hi'.")
    sla_s: float = Field(gt=0, description="Target queue wait in seconds for this tier.")
    weight: float | None = Field(
        default=None, gt=0, le=1e6,
        description="Share of worker time (weighted tier order); None: 8 ** (tiers below).",
    )
    min_score: float | None = Field(
        default=None, ge=0, le=1,
        description="Ignored since tiers became size classes (see placement); still "
                    "validated so existing policies load.",
    )
    promote_after_s: float | None = Field(
        default=None, gt=0, le=30 * 86400,
        description="RabbitMQ aging: a waiting message of this tier older than this is "
                    "raised to its tenant's top priority; None: derived from the SLAs and "
                    "weights (see Policy.promotion_ages). Not allowed on the top tier.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _check_name(value)


class Tenant(_Model):
    """A tenant: the highest tier it may use and its fair-share weight."""

    max_tier: str | None = Field(
        default=None, description="Highest tier this tenant may use; None means the top tier."
    )
    weight: float = Field(default=1.0, gt=0, le=1e6, description="Fair-share weight.")
    sla_s: float | None = Field(
        default=None, gt=0, description="Target queue wait of this tenant's tasks (None: tiers')."
    )
    trusted_header: bool = Field(
        default=True,
        description="Whether the aitp_tenant header or the tenant_kwarg argument may name this "
                    "tenant; if not, only producers pinned to it (producer_tenant) and tasks "
                    "published by its own running tasks are its.",
    )
    tenant_class: str | None = Field(
        default=None,
        description="Share the tier queues of this class of tenant_classes instead of "
                    "queues of its own (None: its own queues); fair share stays per tenant.",
    )


class TenantClass(_Model):
    """Defaults for the tenants of a class, and the tier queues they share.

    A class's tenants keep their own fair-share identity (usage, demotion, metrics) but
    share ``aitp.<class>.<accelerator>.<tier>``: a worker reads a bounded number of queues
    however many tenants there are.
    """

    max_tier: str | None = Field(
        default=None, description="Highest tier a tenant of the class may use; None: the top."
    )
    weight: float = Field(default=1.0, gt=0, le=1e6,
                          description="Fair-share weight of each tenant of the class.")
    sla_s: float | None = Field(
        default=None, gt=0, description="Target queue wait of the class's tasks (None: tiers')."
    )
    trusted_header: bool = Field(
        default=True,
        description="Whether the aitp_tenant header or the tenant_kwarg argument may name a "
                    "tenant of the class the policy does not list (when it is "
                    "unlisted_tenants).",
    )
    queue_weight: float = Field(
        default=1.0, gt=0, le=1e6,
        description="Read weight of the class's shared queues beside dedicated tenants' "
                    "queues (the weighted tier order); fairness inside is the fair share's.",
    )

    def as_tenant(self, name: str) -> Tenant:
        """The spec of one tenant of this class (``name``: the class)."""
        return Tenant(max_tier=self.max_tier, weight=self.weight, sla_s=self.sla_s,
                      trusted_header=self.trusted_header, tenant_class=name)


class SplitSettings(_Model):
    """Which part of the traffic is routed in the split stage."""

    percent: float = Field(default=0.0, ge=0, le=100, description="Share of tasks routed.")
    # bounded: every producer matches each task against them (50,000 task globs made a
    # publish take 12 ms)
    tenants: tuple[str, ...] = Field(default=(), max_length=MAX_SELECTORS,
                                     description="Only these tenants (empty: all).")
    tasks: tuple[str, ...] = Field(
        default=(), max_length=MAX_SELECTORS,
        description="Only task names matching these glob patterns (empty: all)."
    )
    tiers: tuple[str, ...] = Field(default=(), max_length=MAX_SELECTORS,
                                   description="Only these tiers (empty: all).")
    max_uncertainty: float | None = Field(
        default=None,
        gt=0,
        description="Only tasks whose p90/p50 prediction ratio is at most this (None: any).",
    )


class GuardConditions(_Model):
    """What the routed arm must show in every analysis; a condition set to None is not checked."""

    min_sla_hit_rate: float | None = Field(
        default=0.95, ge=0, le=1,
        description="Least share of routed-arm runs that waited within their tier's sla_s.",
    )
    max_wait_ratio: float | None = Field(
        default=1.5, gt=0,
        description="Routed-arm p90 wait at most this times the control group's p90 wait "
                    "(plus wait_slack_s); the control group is the standard arm's runs that "
                    "match the split's selectors.",
    )
    wait_slack_s: float = Field(
        default=0.5, ge=0,
        description="Seconds added to the allowed wait, so near-zero waits do not fail on noise.",
    )
    max_prediction_error: float | None = Field(
        default=None, gt=0,
        description="Largest median relative runtime prediction error on the routed arm "
                    "(0.5 = 50%); not checked while no run carries a prediction.",
    )
    max_queue_age_sla: float | None = Field(
        default=3.0, gt=0,
        description="No starvation: the oldest message waiting in any tier queue may be at "
                    "most this many times its tier's sla_s old.",
    )
    max_fallback_rate: float | None = Field(
        default=0.05, ge=0, le=1,
        description="Largest share of routed-arm runs that fell back to Celery's route.",
    )
    max_failure_rate_increase: float | None = Field(
        default=0.02, ge=0, le=1,
        description="Routed-arm task failure rate at most the control group's plus this.",
    )


class GuardSettings(_Model):
    """The guarded promotion loop (``celery aitp guard``), in the spirit of Argo Rollouts."""

    steps: tuple[float, ...] = Field(
        default=(5.0, 25.0, 50.0, 100.0), min_length=1, max_length=50,
        description="Split percentages to go through, increasing, each in (0, 100].",
    )
    interval_s: float = Field(
        default=60.0, gt=0, le=86_400, description="Seconds between analyses.",
    )
    min_samples: int = Field(
        default=30, ge=1,
        description="Routed-arm runs an analysis needs for a verdict; with fewer it is "
                    "inconclusive (nothing changes) unless a condition already failed.",
    )
    passes_per_step: int = Field(
        default=1, ge=1, description="Passing analyses at a step before the next step.",
    )
    failure_limit: int = Field(
        default=2, ge=1,
        description="Failed analyses (during one guard run) that trigger the rollback to "
                    "coexistence; 1 rolls back on the first failure.",
    )
    promote: bool = Field(
        default=False,
        description="After the last step passes, switch to takeover (else stay in split).",
    )
    dry_run: bool = Field(
        default=False,
        description="Only report what the guard would do (also: 'aitp guard --dry-run').",
    )
    watch_takeover: bool = Field(
        default=True,
        description="After promoting (or when started in takeover), keep analysing "
                    "takeover's runs against the split's last control baseline; at "
                    "failure_limit failed analyses step back (see takeover_step_back).",
    )
    takeover_step_back: Literal["split", "coexistence"] = Field(
        default="split",
        description="Where a failing takeover goes: 'split' (the last step below 100%, "
                    "guarded again, no second promotion in the same run) or "
                    "'coexistence' (the rollback, tier queues drained).",
    )
    conditions: GuardConditions = Field(
        default_factory=GuardConditions, description="What every analysis checks.",
    )

    @field_validator("steps")
    @classmethod
    def _steps(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if any(not 0 < step <= 100 for step in value):
            raise ValueError("every step must be a percentage in (0, 100]")
        if any(b <= a for a, b in zip(value, value[1:], strict=False)):
            raise ValueError("steps must increase")
        return value


class VisibilityGuardSettings(_Model):
    """Tasks that may stay unacknowledged longer than Redis's ``visibility_timeout``.

    Kombu's Redis transport delivers such a message again while the first worker still
    holds it (an ETA task waits unacknowledged until its ETA; an ``acks_late`` task while
    it runs), so the task runs twice. The guard warns and counts them; by ``action`` it
    also sends the ones the middleware would route elsewhere. Redis transports only.
    """

    enabled: bool = Field(default=True, description="Check tasks at all (Redis brokers only).")
    margin: float = Field(
        default=0.8, gt=0, le=1,
        description="Share of visibility_timeout a task's ETA wait plus predicted run may "
                    "reach before the guard acts.",
    )
    action: Literal["warn", "default_queue", "queue"] = Field(
        default="warn",
        description="warn: log and count only; default_queue: also send a task the "
                    "middleware would route to Celery's default queue; queue: to `queue`.",
    )
    queue: str | None = Field(
        default=None, min_length=1, max_length=200,
        description="Queue for action 'queue' (a queue your workers consume; not a tier queue).",
    )
    runtime: Literal["p50", "p90"] = Field(
        default="p90", description="Which predicted runtime counts: the median or the p90."
    )
    log_interval_s: float = Field(
        default=300.0, ge=0, description="At most one warning per task name this often."
    )

    @model_validator(mode="after")
    def _queue_given(self) -> VisibilityGuardSettings:
        if self.action == "queue" and not self.queue:
            raise ValueError("action 'queue' needs visibility_guard.queue")
        if self.queue and self.queue.startswith("aitp."):
            raise ValueError(f"queue {self.queue!r}: must not be a tier queue (aitp.*)")
        return self


class Policy(_Model):
    """The whole scheduling policy. See docs/configuration.md."""

    tiers: tuple[Tier, ...] = Field(
        default=(Tier(name="hi", sla_s=5), Tier(name="mid", sla_s=60), Tier(name="lo", sla_s=600)),
        min_length=1,
        max_length=10,
        description="Ordered tiers, highest first.",
    )
    tenants: dict[str, Tenant] = Field(
        default_factory=lambda: {"default": Tenant()},
        description="Known tenants by name.",
    )
    default_tenant: str = Field(default="default", description="Tenant for unmarked tasks.")
    tenant_classes: dict[str, TenantClass] = Field(
        default_factory=dict,
        description="Classes of tenants sharing tier queues, by name (not a tenant's name).",
    )
    unlisted_tenants: str | None = Field(
        default=None,
        description="Class of tenants the policy does not list, named by the header or "
                    "tenant_kwarg: each keeps its own fair-share identity (None: such tasks "
                    "get the default tenant).",
    )
    accelerators: tuple[str, ...] = Field(
        default=("cpu", "gpu"), min_length=1, description="Accelerator classes."
    )
    default_accelerator: str = Field(default="cpu", description="Class for undeclared tasks.")
    default_tier: str | None = Field(
        default=None, description="Tier of tasks that declare none; None means the lowest tier."
    )
    tenant_kwarg: str | None = Field(
        default=None,
        description="Keyword argument naming the tenant when no aitp_tenant header is given.",
    )
    stage: Stage = Field(
        default=Stage.COEXISTENCE,
        description="Initial stage; the stage stored in the shared store wins once set.",
    )
    split: SplitSettings = Field(default_factory=SplitSettings, description="Split settings.")
    guard: GuardSettings = Field(
        default_factory=GuardSettings, description="Guarded promotion and rollback."
    )
    labels: dict[str, float] = Field(
        default_factory=dict,
        description="Business-impact labels and their weight in [0, 1].",
    )
    priority: PrioritySettings = Field(
        default_factory=PrioritySettings, description="The priority matrix."
    )
    placement: PlacementSettings = Field(
        default_factory=PlacementSettings, description="Tiers as size classes."
    )
    feedback: FeedbackSettings = Field(
        default_factory=FeedbackSettings, description="Boosts for tenants missing SLAs."
    )
    fair_share: FairShareSettings = Field(
        default_factory=FairShareSettings, description="Per-tenant fair share."
    )
    reserve: ReserveSettings = Field(
        default_factory=ReserveSettings, description="Processes workers keep for their "
                                                     "higher tiers (Redis)."
    )
    spill: SpillSettings = Field(
        default_factory=SpillSettings, description="Saturated tiers spill to idle standard "
                                                   "workers."
    )
    profiles: ProfileSettings = Field(
        default_factory=ProfileSettings, description="Resource profiles from observed runs."
    )
    tier_order: TierOrder = Field(
        default=TierOrder.WEIGHTED,
        description="How AITP workers read their tiers (Redis: weighted order; RabbitMQ: "
                    "aging of waiting messages).",
    )
    aging: AgingSettings = Field(
        default_factory=AgingSettings, description="RabbitMQ aging passes (weighted order)."
    )
    visibility_guard: VisibilityGuardSettings = Field(
        default_factory=VisibilityGuardSettings,
        description="Warn about (and divert) tasks near Redis's visibility_timeout.",
    )

    @field_validator("accelerators")
    @classmethod
    def _accelerators(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            _check_name(name)
        if len(set(value)) != len(value):
            raise ValueError("accelerator names must be unique")
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, float]) -> dict[str, float]:
        bad = [f"{name!r}: weight {weight!r} is not in [0, 1]" for name, weight in value.items()
               if not 0 <= weight <= 1]
        bad += [f"{name!r}: not a valid label name" for name in value
                if not LABEL_PATTERN.match(name)]
        if bad:
            raise ValueError("; ".join(bad))
        return value

    @field_validator("tenants")
    @classmethod
    def _tenants(cls, value: dict[str, Tenant]) -> dict[str, Tenant]:
        for name in value:
            _check_name(name)
        return value

    @field_validator("tenant_classes")
    @classmethod
    def _classes(cls, value: dict[str, TenantClass]) -> dict[str, TenantClass]:
        for name in value:
            _check_name(name)
        return value

    @model_validator(mode="after")
    def _cross_refs(self) -> Policy:
        names = [t.name for t in self.tiers]
        if len(set(names)) != len(names):
            raise ValueError("tier names must be unique")
        problems = [
            f"tenants.{tenant}.max_tier: unknown tier {spec.max_tier!r} (tiers: {', '.join(names)})"
            for tenant, spec in self.tenants.items()
            if spec.max_tier is not None and spec.max_tier not in names
        ]
        if self.default_tenant not in self.tenants:
            problems.append(f"default_tenant: {self.default_tenant!r} is not in tenants")
        problems += _class_problems(self, names)
        if self.default_accelerator not in self.accelerators:
            problems.append(
                f"default_accelerator: {self.default_accelerator!r} not in accelerators"
            )
        if self.default_tier is not None and self.default_tier not in names:
            problems.append(f"default_tier: unknown tier {self.default_tier!r}")
        problems += [
            f"split.tiers: unknown tier {t!r}" for t in self.split.tiers if t not in names
        ]
        problems += [
            f"split.tenants: unknown tenant {t!r}"
            for t in self.split.tenants  # unlisted ones count, when the policy takes them
            if t not in TenantNames(self)
        ]
        problems += [
            f"spill.alternatives.{cls}: unknown accelerator class {alt!r}"
            for cls, alts in self.spill.alternatives.items() for alt in (cls, *alts)
            if alt not in self.accelerators
        ]
        problems += _min_score_problems(self.tiers)
        if self.tiers[0].promote_after_s is not None:
            problems.append("tiers.0.promote_after_s: the top tier is never promoted")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    # --- convenience used on the hot path; cheap, derived from frozen fields ---

    @property
    def tier_names(self) -> tuple[str, ...]:
        """Tier names, highest first."""
        return tuple(t.name for t in self.tiers)

    def tier_rank(self, tier: str) -> int:
        """0 for the highest tier; larger is lower."""
        return self.tier_names.index(tier)

    def lowest_tier(self) -> str:
        return self.tiers[-1].name

    def tier_weights(self) -> dict[str, float]:
        """Read weight per tier: explicit, else ``8 ** (number of tiers below it)``."""
        n = len(self.tiers)
        return {t.name: t.weight if t.weight is not None else TIER_WEIGHT_RATIO ** (n - 1 - i)
                for i, t in enumerate(self.tiers)}

    def promotion_ages(self) -> dict[str, float]:
        """Age (s since first publish) after which a waiting message of each lower tier is
        raised to the top priority on RabbitMQ; the top tier is absent.

        Default for tier ``t``: ``min(sla_top * w_top / w_t, max(sla_t - sla_top, sla_t /
        2))``. The first term is how much longer than a top-tier message the weighted order
        delays tier ``t`` under contention (the weight ratio, 8 per tier by default); the
        second leaves the top tier's SLA for the wait after the promotion, so a tier meets
        its SLA whenever the top tier meets its own.
        """
        weights = self.tier_weights()
        top = self.tiers[0]
        ages = {}
        for tier in self.tiers[1:]:
            if tier.promote_after_s is not None:
                ages[tier.name] = tier.promote_after_s
                continue
            ratio = top.sla_s * weights[top.name] / weights[tier.name]
            ages[tier.name] = min(ratio, max(tier.sla_s - top.sla_s, tier.sla_s / 2))
        return ages

    def tier_min_scores(self) -> tuple[float, ...]:
        """Lowest score of each tier, highest tier first; the lowest tier takes the rest."""
        n = len(self.tiers)
        scores = [t.min_score if t.min_score is not None else 1 - (i + 1) / n
                  for i, t in enumerate(self.tiers)]
        scores[-1] = 0.0
        return tuple(scores)

    def allowed_tiers(self, tenant: str) -> tuple[str, ...]:
        """Tiers the tenant (or, for a class's queues, the class) may use, highest first."""
        spec: Tenant | TenantClass | None = self.tenant_spec(tenant)
        if tenant not in self.tenants and tenant in self.tenant_classes:
            spec = self.tenant_classes[tenant]
        cap = spec.max_tier if spec is not None else None
        names = self.tier_names
        return names if cap is None else names[names.index(cap) :]

    # --- tenant classes ---

    def tenant_spec(self, tenant: str) -> Tenant | None:
        """A listed tenant's spec; for another, its ``unlisted_tenants`` class's (None if
        the policy takes no unlisted tenants)."""
        spec = self.tenants.get(tenant)
        if spec is None and self.unlisted_tenants is not None:
            return _class_spec(self.tenant_classes[self.unlisted_tenants], self.unlisted_tenants)
        return spec

    def queue_owner(self, tenant: str) -> str:
        """Whose tier queues hold the tenant's tasks: its class's, or its own."""
        spec = self.tenant_spec(tenant)
        if spec is not None and spec.tenant_class is not None:
            return spec.tenant_class
        return tenant

    def queue_owners(self) -> tuple[str, ...]:
        """Every owner of tier queues: tenants with queues of their own, then classes."""
        own = tuple(t for t, spec in self.tenants.items() if spec.tenant_class is None)
        return own + tuple(self.tenant_classes)


class TenantNames:
    """``name in TenantNames(policy)``: a listed tenant, or (with ``unlisted_tenants``) any
    valid tenant name, which then has its own identity in the unlisted class."""

    def __init__(self, policy: Policy) -> None:
        self.listed = frozenset(policy.tenants)
        self.open = policy.unlisted_tenants is not None
        #: A class's name is never a tenant's (a listed tenant may not take one either):
        #: its queues, counters and metric labels are the class's.
        self.classes = frozenset(policy.tenant_classes)

    def __contains__(self, name: object) -> bool:
        if name in self.listed:
            return True
        return self.open and isinstance(name, str) and name not in self.classes \
            and NAME_PATTERN.match(name) is not None


@functools.lru_cache(maxsize=256)
def _class_spec(spec: TenantClass, name: str) -> Tenant:
    """``spec.as_tenant(name)``, built once per class (frozen models hash by value)."""
    return spec.as_tenant(name)


def _class_problems(policy: Policy, tiers: list[str]) -> list[str]:
    """Classes: known tiers, names apart from tenants', references that exist."""
    classes = policy.tenant_classes
    problems = [
        f"tenant_classes.{name}.max_tier: unknown tier {spec.max_tier!r} "
        f"(tiers: {', '.join(tiers)})"
        for name, spec in classes.items()
        if spec.max_tier is not None and spec.max_tier not in tiers
    ]
    problems += [f"tenant_classes.{name}: a tenant has this name (queues would be shared)"
                 for name in classes if name in policy.tenants]
    problems += [
        f"tenants.{tenant}.tenant_class: unknown class {spec.tenant_class!r}"
        for tenant, spec in policy.tenants.items()
        if spec.tenant_class is not None and spec.tenant_class not in classes
    ]
    if policy.unlisted_tenants is not None and policy.unlisted_tenants not in classes:
        problems.append(f"unlisted_tenants: unknown class {policy.unlisted_tenants!r}")
    return problems


def _min_score_problems(tiers: tuple[Tier, ...]) -> list[str]:
    """Explicit ``min_score`` values must fall from the highest tier to the lowest."""
    n = len(tiers)
    last = 1.01
    problems = []
    for i, tier in enumerate(tiers[:-1]):
        score = tier.min_score if tier.min_score is not None else 1 - (i + 1) / n
        if score >= last:
            problems.append(f"tiers.{i}.min_score: {score:g} must be below the tier above's")
        last = score
    return problems


def _path_part(part: Any) -> str:
    """A field path element as written in a policy, quoted when it is not a plain name."""
    text = str(part)
    return text if _PLAIN_KEY.fullmatch(text) else repr(text)


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _format_errors(exc: ValidationError) -> str:
    errors = exc.errors()
    # a list whose items failed is also reported as too short (the failed items do not
    # count): say only what is wrong with the items
    failed_under = {tuple(err["loc"][:i]) for err in errors for i in range(len(err["loc"]))}
    lines = []
    for err in errors:
        if err["type"] == "too_short" and tuple(err["loc"]) in failed_under:
            continue
        path = ".".join(_path_part(p) for p in err["loc"]) or "(policy)"
        message = err["msg"].removeprefix("Value error, ")
        lines.append(f"{path}: {message}")
    return "\n".join(lines)


def parse_policy(data: Mapping[str, Any]) -> Policy:
    """Validate a mapping into a Policy, or raise PolicyError listing every bad field."""
    if not isinstance(data, Mapping):
        raise PolicyError(f"(policy): expected a mapping, got {type(data).__name__}")
    try:
        return Policy.model_validate(dict(data))
    except ValidationError as exc:
        raise PolicyError(_format_errors(exc)) from None
    except RecursionError:  # a self-referencing YAML alias, or absurd nesting
        raise PolicyError("(policy): nested too deeply (or refers to itself)") from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that names a key twice: the last one won
    silently, so a tenant capped at ``lo`` and listed again further down with ``hi``
    validated as ``hi``."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _json_object_unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads`` object hook refusing a key named twice (as :class:`_UniqueKeyLoader`)."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(f"duplicate key {key!r}")
        found[key] = value
    return found


def read_policy_file(path: str | Path) -> Policy:
    """Load a policy from a YAML (.yml/.yaml) or JSON file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read policy file ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise PolicyError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    kind = "JSON" if path.suffix == ".json" else "YAML"
    try:
        if path.suffix == ".json":
            data = json.loads(text, object_pairs_hook=_json_object_unique)
        else:
            loader = _UniqueKeyLoader(text)  # a SafeLoader: plain data only
            try:
                data = loader.get_single_data()
            finally:
                loader.dispose()
    except (ValueError, yaml.YAMLError) as exc:
        raise PolicyError(f"{path}: not valid {kind}: {exc}") from None
    except RecursionError:
        raise PolicyError(f"{path}: not valid {kind}: nested too deeply") from None
    return parse_policy(data if data is not None else {})


def load_policy(source: Policy | Mapping[str, Any] | str | Path | None) -> Policy:
    """Accept a Policy, a dict, a file path, or None (the defaults)."""
    if source is None:
        return Policy()
    if isinstance(source, Policy):
        return source
    if isinstance(source, (str, Path)):
        return read_policy_file(source)
    return parse_policy(source)
