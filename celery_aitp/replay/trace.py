"""Recorded runs to replay: observation records, validated once, kept in arrival order.

A record is one observed run in the observation schema the workers write (see
docs/prediction.md): at least ``task``, ``published_at`` (epoch seconds) and ``runtime_s``; the
simulator also uses ``tenant``, ``args``, ``kwargs``, ``accelerator``, ``tier``,
``task_id``, ``started_at`` and ``retries`` when present. Bad records are skipped and
counted by reason, never a crash.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from celery_aitp.jsonl import Skipped, json_lines, open_text
from celery_aitp.numbers import finite_number


class Trace:
    """Valid records sorted by publish time, plus what was skipped and why."""

    __slots__ = ("records", "published", "runtime", "skipped")

    def __init__(self, records: list[dict[str, Any]], skipped: Counter[str] | None = None) -> None:
        order = sorted(range(len(records)), key=lambda i: (records[i]["published_at"], i))
        self.records = [records[i] for i in order]
        self.published = [float(r["published_at"]) for r in self.records]
        self.runtime = [float(r["runtime_s"]) for r in self.records]
        self.skipped: Counter[str] = skipped if skipped is not None else Counter()

    def __len__(self) -> int:
        return len(self.records)

    @property
    def span_s(self) -> float:
        """Seconds from the first to the last arrival."""
        return self.published[-1] - self.published[0] if self.records else 0.0

    def skipped_summary(self) -> str:
        """One line, e.g. ``skipped 3 record(s): bad runtime_s 2, not JSON 1``."""
        total = sum(self.skipped.values())
        if not total:
            return "skipped 0 records"
        parts = ", ".join(f"{why} {n}" for why, n in self.skipped.most_common())
        return f"skipped {total} record(s): {parts}"


_number = finite_number


def check_record(raw: Any) -> tuple[dict[str, Any] | None, str]:
    """(normalised record, "") or (None, reason it cannot be replayed)."""
    if not isinstance(raw, Mapping):
        return None, "not an object"
    task = raw.get("task")
    if not isinstance(task, str) or not task:
        return None, "missing task"
    published = _number(raw.get("published_at"))
    if published is None or published <= 0:
        return None, "bad published_at"
    runtime = _number(raw.get("runtime_s"))
    if runtime is None or runtime < 0:
        return None, "bad runtime_s"
    record = dict(raw)
    record["published_at"] = published
    record["runtime_s"] = runtime
    if not isinstance(record.get("args"), (list, tuple)):
        record["args"] = []
    if not isinstance(record.get("kwargs"), Mapping):
        record["kwargs"] = {}
    for name in ("tenant", "accelerator", "tier", "task_id", "queue"):
        if not isinstance(record.get(name), str):
            record[name] = None
    started = _number(raw.get("started_at"))
    record["started_at"] = started
    return record, ""


def from_records(raw_records: Iterable[Any], skipped: Counter[str] | None = None) -> Trace:
    """A Trace from already-parsed records (e.g. the store's observation stream)."""
    skipped = skipped if skipped is not None else Counter()
    kept = []
    for raw in raw_records:
        record, why = check_record(raw)
        if record is None:
            skipped[why] += 1
        else:
            kept.append(record)
    return Trace(kept, skipped)


def _json_lines(path: Path, skipped: Counter[str]) -> Iterator[Any]:
    for value in json_lines(path):
        if isinstance(value, Skipped):
            skipped[value.reason] += 1
        else:
            yield value


def load_jsonl(path: str | Path) -> Trace:
    """Read a JSON-lines file of observation records (one object per line; ``.gz`` too)."""
    skipped: Counter[str] = Counter()
    return from_records(_json_lines(Path(path), skipped), skipped)


def write_jsonl(records: Iterable[Mapping[str, Any]], path: str | Path) -> int:
    """Write records as JSON lines (gzip-compressed if the name ends in ``.gz``)."""
    n = 0
    with open_text(path, "w") as handle:
        for record in records:
            handle.write(json.dumps(record, default=str, separators=(",", ":")) + "\n")
            n += 1
    return n
