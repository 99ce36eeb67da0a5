"""A task's resource profile: what its runs used, merged with what it declares.

Observed targets follow Kubernetes' VPA recommender: a percentile of a decaying
histogram (``profiles.target_percentile``, p90 by default) plus a safety margin
(``profiles.margin``, 15%), never below a floor, and only once ``profiles.min_samples``
runs were measured. Declarations (``@app.task(aitp={"accelerator": ..., "memory_mb": ...,
"cpu": ...})``) always win: they are the developer's explicit statement, and the
observed value is kept next to them so ``explain`` shows when a declaration is off.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from celery_aitp.priority_policy import ProfileSettings
from celery_aitp.profiles.histogram import percentile

#: Histogram families: store field prefix -> first bucket bound (the unit's resolution).
FAMILIES = {"cpu": 0.001, "cores": 0.01, "mem": 1.0}
#: Field prefix of accelerator use counts: 'acc:<class>' or 'acc:none'.
ACCEL = "acc"
NO_ACCELERATOR = "none"


@dataclass(frozen=True)
class ObservedProfile:
    """Targets learnt from runs; None where too few runs were measured."""

    runs: int
    cpu_s: float | None = None
    cpu_cores: float | None = None
    memory_mb: float | None = None
    accelerator: str | None = None  # inferred class; None: no accelerator evidence
    accelerator_share: float | None = None  # share of measured runs that used one
    accelerator_runs: int = 0


def _families(values: Mapping[str, float]) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {name: {} for name in (*FAMILIES, ACCEL)}
    for field, weight in values.items():
        family, _, index = field.partition(":")
        if family in FAMILIES:
            try:
                out[family][int(index)] = weight
            except ValueError:
                continue
    return out


def _accelerator_weights(values: Mapping[str, float]) -> dict[str, float]:
    prefix = ACCEL + ":"
    return {f[len(prefix):]: w for f, w in values.items() if f.startswith(prefix) and w > 0}


def _target(weights: Mapping[int, float], first: float, runs: float, floor: float,
            settings: ProfileSettings) -> float | None:
    if runs < settings.min_samples:
        return None
    value = percentile(weights, settings.target_percentile, first)
    if value is None:
        return None
    return max(floor, value * (1.0 + settings.margin))


def observed_profile(values: Mapping[str, float], raw: Mapping[str, float],
                     settings: ProfileSettings, accelerators: tuple[str, ...]) -> ObservedProfile:
    """Build targets from decayed histogram weights (``values``) and raw run counts."""
    families = _families(values)
    floors = settings.floors
    accel_runs = int(raw.get("_n:acc", 0))
    accel = _accelerator_weights(values)
    total = sum(accel.values())
    used = {k: w for k, w in accel.items() if k != NO_ACCELERATOR}
    best = max(used, key=used.__getitem__) if used else None
    share = (sum(used.values()) / total) if total > 0 else None
    inferred = None
    if (best is not None and accel_runs >= settings.min_samples and total > 0
            and used[best] / total >= settings.infer_accelerator_share and best in accelerators):
        inferred = best
    return ObservedProfile(
        runs=int(raw.get("_n", 0)),
        cpu_s=_target(families["cpu"], FAMILIES["cpu"], raw.get("_n:cpu", 0), floors.cpu_s,
                      settings),
        cpu_cores=_target(families["cores"], FAMILIES["cores"], raw.get("_n:cpu", 0),
                          floors.cpu_cores, settings),
        memory_mb=_target(families["mem"], FAMILIES["mem"], raw.get("_n:mem", 0),
                          floors.memory_mb, settings),
        accelerator=inferred,
        accelerator_share=None if share is None else round(share, 4),
        accelerator_runs=accel_runs,
    )


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value > 0 else None


@dataclass(frozen=True)
class MergedProfile:
    """What the publish path uses: the class to route to and the profile to record."""

    accelerator: str
    record: dict[str, Any]  # shared by every decision of this task: never mutate
    notes: tuple[str, ...] = ()


def merge_profile(declared: Mapping[str, Any], observed: ObservedProfile | None,
                  accelerators: frozenset[str], default_accelerator: str) -> MergedProfile:
    """Declared values win; observed targets fill in the rest; the default class last."""
    notes: list[str] = []
    sources: dict[str, str] = {}
    wanted = declared.get("accelerator")
    if wanted is not None and wanted in accelerators:
        accelerator, sources["accelerator"] = str(wanted), "declared"
    else:
        if wanted is not None:
            notes.append("accelerator_unknown")
        if observed is not None and observed.accelerator is not None:
            accelerator, sources["accelerator"] = observed.accelerator, "observed"
        else:
            accelerator, sources["accelerator"] = default_accelerator, "default"
    record: dict[str, Any] = {"accelerator": accelerator}
    pairs = (("cpu_cores", "cpu"), ("memory_mb", "memory_mb"), ("cpu_s", None))
    for name, declared_key in pairs:
        value = _positive(declared.get(declared_key)) if declared_key else None
        seen = getattr(observed, name) if observed is not None else None
        if value is not None:
            record[name], sources[name] = value, "declared"
            if seen is not None:
                record[f"observed_{name}"] = round(seen, 6)
        elif seen is not None:
            record[name], sources[name] = round(seen, 6), "observed"
        else:
            record[name] = None
    record["runs"] = observed.runs if observed is not None else 0
    record["accelerator_share"] = observed.accelerator_share if observed is not None else None
    record["sources"] = sources
    return MergedProfile(accelerator, record, tuple(notes))
