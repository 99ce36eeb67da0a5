"""Standard Workload Format (SWF) batch-job logs -> observation records.

An HPC or batch scheduler's job history is a ready-made set of observed runs: the
Parallel Workloads Archive publishes many such logs in SWF (one job per line, 18
numbers, ``-1`` for unknown; ``;`` starts a header line). This module turns each
usable job into the observation record that ``celery-aitp train --observations``,
``celery-aitp predict`` and ``celery-aitp replay`` read (docs/prediction.md):

=================  ===========================================================
``task``           ``exe<N>`` from the executable number, or ``job`` if unknown
``tenant``         ``user<N>`` from the user id, or ``unknown``
``published_at``   header ``UnixStartTime`` + submit time
``started_at``     ``published_at`` + wait time (wait unknown: ``published_at``)
``runtime_s``      run time
``kwargs``         what was known at submission: ``procs`` (requested, else
                   allocated), ``requested_time_s``, ``queue``, ``partition``,
                   ``group`` (each only when the log has it)
=================  ===========================================================

Only what the user gave at submission becomes a feature; CPU time, memory used,
status and allocated processors (when requested ones are known) are outcomes, not
inputs. Jobs with a run time of zero or less, cancelled jobs (status 5) and lines
that are not 18 numbers are skipped and counted by reason.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

from celery_aitp.predict.features import argument_features

#: Fields of one SWF job line (1-based numbers in the SWF definition, 0-based here).
JOB, SUBMIT, WAIT, RUN, ALLOC_PROCS, REQ_PROCS, REQ_TIME = 0, 1, 2, 3, 4, 7, 8
STATUS, USER, GROUP, EXECUTABLE, QUEUE, PARTITION = 10, 11, 12, 13, 14, 15
FIELDS = 18
CANCELLED = 5
#: Used when the header has no ``UnixStartTime`` (2000-01-01 UTC): times stay positive.
DEFAULT_START = 946684800.0


class SwfResult:
    """What a conversion wrote and skipped."""

    def __init__(self) -> None:
        self.written = 0
        self.skipped: Counter[str] = Counter()
        self.start: float | None = None

    def summary(self) -> str:
        """``wrote N records; skipped K (reason: n, ...)``."""
        line = f"wrote {self.written} records"
        total = sum(self.skipped.values())
        if total:
            reasons = ", ".join(f"{why}: {n}" for why, n in self.skipped.most_common())
            line += f"; skipped {total} ({reasons})"
        if self.start is None:
            line += f"; no UnixStartTime in the header, times start at {DEFAULT_START:.0f}"
        return line


def _known(value: float) -> bool:
    return value >= 0


def _integer(value: float) -> int | float:
    return int(value) if value == int(value) else value


def header_start(line: str) -> float | None:
    """``UnixStartTime`` from a header line, or None."""
    body = line.lstrip(";").strip()
    name, _, value = body.partition(":")
    if name.strip().lower() != "unixstarttime":
        return None
    try:
        start = float(value.strip())
    except ValueError:
        return None
    return start if math.isfinite(start) else None


def parse_job(line: str) -> list[float] | str:
    """The 18 numbers of a job line, or the reason the line is unusable."""
    parts = line.split()
    if len(parts) != FIELDS:
        return f"not {FIELDS} fields"
    try:
        values = [float(p) for p in parts]
    except ValueError:
        return "not numbers"
    if not all(math.isfinite(v) for v in values):
        return "not numbers"
    return values


def job_record(job: list[float], start: float) -> dict[str, Any] | str:
    """The observation record of one job, or the reason it is skipped."""
    if job[STATUS] == CANCELLED:
        return "cancelled"
    runtime = job[RUN]
    if runtime <= 0:
        return "run time <= 0"
    if not _known(job[SUBMIT]):
        return "no submit time"
    published = start + job[SUBMIT]
    wait = job[WAIT] if _known(job[WAIT]) else 0.0
    kwargs: dict[str, Any] = {}
    procs = job[REQ_PROCS] if job[REQ_PROCS] > 0 else job[ALLOC_PROCS]
    if procs > 0:
        kwargs["procs"] = _integer(procs)
    if job[REQ_TIME] > 0:
        kwargs["requested_time_s"] = _integer(job[REQ_TIME])
    for name, index in (("queue", QUEUE), ("partition", PARTITION), ("group", GROUP)):
        if _known(job[index]):
            kwargs[name] = _integer(job[index])
    features = {k: (None if isinstance(v, float) and v != v else v)
                for k, v in argument_features((), kwargs).items()}
    return {
        "v": 1,
        "task": f"exe{int(job[EXECUTABLE])}" if _known(job[EXECUTABLE]) else "job",
        "task_id": f"swf-{int(job[JOB])}",
        "tenant": f"user{int(job[USER])}" if _known(job[USER]) else "unknown",
        "published_at": published,
        "started_at": published + wait,
        "runtime_s": _integer(runtime),
        "args": [],
        "kwargs": kwargs,
        "features": features,
    }


def swf_records(lines: Iterable[str], result: SwfResult | None = None,
                start: float | None = None) -> Iterator[dict[str, Any]]:
    """Observation records of the usable jobs, in file order.

    ``start`` overrides the header's ``UnixStartTime``. Header lines after the first job
    are ignored (the start time must come before the jobs it dates).
    """
    result = result if result is not None else SwfResult()
    seen_job = False
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        if line.startswith(";"):
            if not seen_job and result.start is None:
                result.start = header_start(line)
            continue
        seen_job = True
        job = parse_job(line)
        if isinstance(job, str):
            result.skipped[job] += 1
            continue
        base = start if start is not None else (
            result.start if result.start is not None else DEFAULT_START)
        record = job_record(job, base)
        if isinstance(record, str):
            result.skipped[record] += 1
            continue
        result.written += 1
        yield record
    if start is not None:
        result.start = start
