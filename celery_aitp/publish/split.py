"""Which tasks the split stage routes: selectors, then a stable percentage.

A task is on the routed arm when it matches every selector (tenant, task-name glob,
tier, prediction confidence) and the bucket of its *arm key* is below the percentage.
The arm key is the workflow's ``root_id`` when the message has one (every step of a
chain, a chord body and the members of a group published from a task share it), else
the task id (a retry keeps its id). So a retry or a chain step lands on the arm its
first task landed on, in every process, without any shared state.

:class:`SplitRule` is compiled once per split setting (the live view hands out the
same ``SplitSettings`` object until the stored document changes), so the gate pays a
few dictionary and set look-ups per publish, not a glob match per pattern.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable
from fnmatch import translate

from celery_aitp.policy import SplitSettings


def split_bucket(key: str) -> float:
    """A stable number in [0, 100) from an arm key (task id or root id)."""
    return (zlib.crc32(key.encode("utf-8", "replace")) % 10_000) / 100.0


def arm_key(task_id: str, root_id: str | None) -> str:
    """What the arm is decided on: the workflow's root id, else the task's own id."""
    return root_id or task_id


def _glob_matcher(patterns: tuple[str, ...]) -> Callable[[str], object] | None:
    if not patterns:
        return None
    return re.compile("|".join(f"(?:{translate(p)})" for p in patterns)).match


class SplitRule:
    """A compiled :class:`SplitSettings`: cheap to ask on every publish."""

    __slots__ = ("source", "percent", "tenants", "tiers", "task_match", "max_uncertainty",
                 "selective")

    def __init__(self, split: SplitSettings) -> None:
        self.source = split
        self.percent = split.percent
        self.tenants = frozenset(split.tenants)
        self.tiers = frozenset(split.tiers)
        self.task_match = _glob_matcher(split.tasks)
        self.max_uncertainty = split.max_uncertainty
        self.selective = bool(self.tenants or self.tiers or self.task_match is not None
                              or self.max_uncertainty is not None)

    def selects(self, task: str, tenant: str | None, tier: str | None,
                p50: float | None, p90: float | None) -> bool:
        """Whether a task matches every selector (the percentage aside).

        Also used on observation records, to find the standard-arm tasks that the
        routed arm is fairly compared with.
        """
        if self.tenants and tenant not in self.tenants:
            return False
        if self.tiers and tier not in self.tiers:
            return False
        if self.task_match is not None and self.task_match(task) is None:
            return False
        if self.max_uncertainty is None:
            return True
        if not p50 or p90 is None:  # no prediction: not confident
            return False
        return p90 / p50 <= self.max_uncertainty

    def in_share(self, key: str) -> bool:
        """Whether the arm key's bucket is in the routed percentage (selectors aside)."""
        return self.percent >= 100 or (self.percent > 0 and split_bucket(key) < self.percent)

    def routes(self, key: str, task: str, tenant: str | None, tier: str | None,
               p50: float | None = None, p90: float | None = None) -> bool:
        """Whether the task is on the routed arm."""
        if self.percent <= 0:
            return False
        if self.selective and not self.selects(task, tenant, tier, p50, p90):
            return False
        return self.in_share(key)
