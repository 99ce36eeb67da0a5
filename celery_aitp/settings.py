"""Runtime settings, resolved once: defaults < ``app.conf.aitp_*`` < ``AITP_*`` environment.

Each field documents itself; docs/configuration.md's settings table mirrors this class.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from celery_aitp.errors import PolicyError
from celery_aitp.policy import Policy, load_policy


class Settings(BaseModel):
    """Operational knobs; the scheduling rules themselves live in :class:`Policy`."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    policy: Policy = Field(default_factory=Policy, description="The scheduling policy.")
    store_url: str | None = Field(
        default=None,
        description="Redis URL of the shared store; None means the broker's URL (Redis only).",
    )
    key_prefix: str = Field(
        default="aitp", min_length=1, max_length=64, description="Prefix of every store key."
    )
    refresh_interval_s: float = Field(
        default=1.0, gt=0, le=60, description="How often a process refreshes its cached view."
    )
    max_staleness_s: float = Field(
        default=5.0, gt=0, le=600, description="Older cached views count as 'store unreachable'."
    )
    worker_ttl_s: float = Field(
        default=10.0, gt=0, le=3600, description="A worker's queue advertisement lives this long."
    )
    evacuate_interval_s: float = Field(
        default=5.0, gt=0, le=3600, description="How often orphaned tier queues are drained."
    )
    store_timeout_s: float = Field(
        default=0.5, gt=0, le=30, description="Socket timeout of every store call."
    )
    observation_maxlen: int = Field(
        default=200_000, ge=1000, description="Observations kept in the store (capped stream)."
    )
    decision_maxlen: int = Field(
        default=100_000, ge=1000, description="Shadow decision records kept (capped stream)."
    )
    profile_refresh_s: float = Field(
        default=10.0, gt=0, le=3600, description="How often producers re-read resource profiles."
    )
    accelerator_probe: str = Field(
        default="auto", min_length=1,
        description="Accelerator probe in workers: auto, none, nvml, nvidia-smi or module:Class.",
    )
    per_run_memory: bool = Field(
        default=True, description="Measure each run's peak memory (Linux: resets VmHWM)."
    )
    producer_tenant: str | None = Field(
        default=None,
        description="Pin this process's tasks to one tenant: a header or argument naming "
                    "another is refused (counted tenant_refused).",
    )

    @field_validator("producer_tenant")
    @classmethod
    def _known_tenant(cls, value: str | None, info: ValidationInfo) -> str | None:
        policy = info.data.get("policy")
        if value is not None and policy is not None and value not in policy.tenants:
            raise ValueError(f"{value!r} is not a tenant of the policy "
                             f"({', '.join(sorted(policy.tenants))})")
        return value


_ENV_PREFIX = "AITP_"
_FIELDS = tuple(Settings.model_fields)


def _from_conf(conf: Any) -> dict[str, Any]:
    """Pick ``aitp_<field>`` keys out of a Celery config (or any mapping)."""
    found: dict[str, Any] = {}
    for name in _FIELDS:
        value = conf.get(f"aitp_{name}") if hasattr(conf, "get") else None
        if value is not None:
            found[name] = value
    return found


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    return {
        name: environ[_ENV_PREFIX + name.upper()]
        for name in _FIELDS
        if environ.get(_ENV_PREFIX + name.upper())
    }


def resolve_settings(
    conf: Any = None,
    policy: Any = None,
    environ: Mapping[str, str] | None = None,
    **overrides: Any,
) -> Settings:
    """Build the frozen Settings; raise PolicyError naming each bad field."""
    values = _from_conf(conf or {})
    values.update(_from_env(os.environ if environ is None else environ))
    values.update({k: v for k, v in overrides.items() if v is not None})
    if policy is not None:
        values["policy"] = policy
    values["policy"] = load_policy(values.get("policy"))
    try:
        return Settings.model_validate(values)
    except ValidationError as exc:
        lines = [
            f"aitp_{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        ]
        raise PolicyError("\n".join(lines)) from None
