"""Change the live stage (audited) and roll back to coexistence without losing a task.

Every producer and worker process reads the stage from its live view, refreshed every
``refresh_interval_s`` in the background, so a change written here is followed fleet-wide
within that interval (plus one store round trip), without a restart.

Rollback: once the stage says coexistence nothing new is routed, but tasks already in
tier queues, and the few published by processes that had not refreshed yet, would
still wait there. :meth:`StageControl.rollback` therefore moves every waiting message
from every tier queue to the default queue with the broker adapter's atomic move (each
message is in exactly one queue at every instant: none lost, none run twice), and keeps
doing so until every process has had time to see the change (the settle time). A
straggler that could not reach the store at all is caught by the janitor, which drains
every tier queue on each pass while the stage is coexistence.
"""

from __future__ import annotations

import getpass
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from celery_aitp.core.view import stage_from_doc
from celery_aitp.errors import PolicyError
from celery_aitp.policy import Policy, SplitSettings, Stage, TenantNames
from celery_aitp.store.redis_store import ANY
from celery_aitp.worker.janitor import Janitor

#: Seconds between drain passes while a rollback settles.
DRAIN_PERIOD_S = 0.25


def who_am_i(via: str) -> str:
    """``user@host (via, pid N)``: who made a change and from where, for the audit log."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (some containers)
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()} ({via}, pid {os.getpid()})"


def stage_doc(stage: Stage, split: SplitSettings) -> dict[str, Any]:
    """The stored form of a stage: ``{"stage": ..., "split": {...}}``."""
    return {"stage": stage.value, "split": split.model_dump(mode="json")}


def check_split(split: SplitSettings, policy: Policy) -> SplitSettings:
    """``split`` if its tenants and tiers exist in the policy (a tenant nobody lists
    counts, with ``unlisted_tenants``: a canary of one customer); PolicyError naming them
    if not."""
    names = TenantNames(policy)
    problems = [f"unknown tenant {t!r} (tenants: {', '.join(policy.tenants)}"
                + ("; a tenant class is not a tenant: select its tenants" if t in
                   policy.tenant_classes else "") + ")"
                for t in split.tenants if t not in names]
    problems += [f"unknown tier {t!r} (tiers: {', '.join(policy.tier_names)})"
                 for t in split.tiers if t not in policy.tier_names]
    if problems:
        raise PolicyError("split: " + "; ".join(problems))
    return split


@dataclass
class Change:
    """What a stage change did: the documents before and after, and what was moved."""

    old: dict[str, Any] | None
    new: dict[str, Any]
    moved: dict[str, int] = field(default_factory=dict)

    @property
    def moved_total(self) -> int:
        return sum(self.moved.values())


class StageControl:
    """Read and change the live stage of one deployment (the app's middleware)."""

    def __init__(self, middleware: Any, janitor: Janitor | None = None) -> None:
        self.middleware = middleware
        self.janitor = janitor or Janitor(middleware)

    @property
    def policy(self) -> Policy:
        return self.middleware.policy

    def read(self) -> tuple[Stage, SplitSettings, dict[str, Any] | None]:
        """The live stage and split (the policy's when none is stored) and the raw document."""
        doc = self.middleware.store.read_stage()
        stage, split = stage_from_doc(doc, self.policy)
        return stage, split, doc

    def change(self, stage: Stage, split: SplitSettings | None, who: str,
               why: str | None = None, expect: Any = ANY,
               settle_s: float | None = None) -> Change:
        """Write a new stage (split: keep the stored one when None); coexistence rolls back.

        ``expect``: write only if the stored document still equals it (else
        StageConflict). ``settle_s``: how long a rollback keeps draining tier queues
        (default :meth:`settle_time`).
        """
        if split is None:
            split = self.read()[1]
        doc = stage_doc(stage, check_split(split, self.policy))
        old = self.middleware.store.write_stage(doc, who, why, expect=expect)
        change = Change(old, doc)
        if stage is Stage.COEXISTENCE:
            change.moved = self.drain(self.settle_time() if settle_s is None else settle_s)
        return change

    def rollback(self, who: str, why: str, expect: Any = ANY,
                 settle_s: float | None = None) -> Change:
        """Back to coexistence (split settings kept for later), draining tier queues."""
        return self.change(Stage.COEXISTENCE, None, who, why, expect, settle_s)

    def settle_time(self) -> float:
        """How long until every process that can reach the store has seen a change."""
        return 2 * float(self.middleware.settings.refresh_interval_s) + 0.5

    def drain(self, settle_s: float) -> dict[str, int]:
        """Move every tier queue's waiting messages to the default queue, for ``settle_s``."""
        queues = self.janitor.known_queues()
        moved: dict[str, int] = {}
        deadline = time.monotonic() + max(0.0, settle_s)
        while True:
            for queue, n in self.janitor.evacuate(queues).items():
                moved[queue] = moved.get(queue, 0) + n
            if time.monotonic() >= deadline:
                return moved
            time.sleep(DRAIN_PERIOD_S)

