"""Turn one observed run into histogram increments (the worker folds many into a batch)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from celery_aitp.numbers import finite_number
from celery_aitp.profiles.histogram import bucket_of
from celery_aitp.profiles.profile import ACCEL, FAMILIES

_CLASS = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}\Z")


def _number(value: Any) -> float | None:
    number = finite_number(value)
    return number if number is not None and number >= 0 else None


def run_fields(record: Mapping[str, Any]) -> dict[str, float]:
    """Histogram increments for one run record (see ``worker/observe.py`` for the fields).

    CPU time always counts; average cores only with a positive wall time; memory only
    when it was measured for this run alone (``memory_scope == 'run'``); accelerator use
    only when the probe could tell (``used_accelerator`` is a class name or 'none').
    """
    out: dict[str, float] = {"_n": 1.0}
    cpu = _number(record.get("cpu_s"))
    if cpu is not None:
        out[f"cpu:{bucket_of(cpu, FAMILIES['cpu'])}"] = 1.0
        out["_n:cpu"] = 1.0
        runtime = _number(record.get("runtime_s"))
        if runtime:
            out[f"cores:{bucket_of(cpu / runtime, FAMILIES['cores'])}"] = 1.0
    memory = _number(record.get("run_peak_rss_mb"))
    if memory is not None and record.get("memory_scope") == "run":
        out[f"mem:{bucket_of(memory, FAMILIES['mem'])}"] = 1.0
        out["_n:mem"] = 1.0
    used = record.get("used_accelerator")
    if isinstance(used, str) and _CLASS.match(used):
        out[f"{ACCEL}:{used}"] = 1.0
        out["_n:acc"] = 1.0
    return out


def fold(into: dict[str, float], fields: Mapping[str, float]) -> None:
    """Add ``fields`` to a pending batch."""
    for name, amount in fields.items():
        into[name] = into.get(name, 0.0) + amount
