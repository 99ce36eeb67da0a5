"""The ``profile`` stage: accelerator class and resource profile of a task.

Declared hints win; otherwise what workers observed (the ``profiles`` source, refreshed
in the background); otherwise the policy's default class. The merged profile is cached
per task name and rebuilt only when the observed profile or the declaration object
changes, so a publish costs two dict lookups and three attribute writes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from celery_aitp.cache import BoundedDict
from celery_aitp.core.request import Decision, Request
from celery_aitp.core.view import View
from celery_aitp.policy import Policy
from celery_aitp.profiles.profile import MergedProfile, ObservedProfile, merge_profile
from celery_aitp.profiles.store import ProfileSource

#: Task names whose merged profile is cached; the cache starts over beyond this.
CACHE_LIMIT = 20_000


class ProfileStage:
    """Fills ``decision.accelerator`` and ``decision.profile``."""

    name = "profile"

    def __init__(self, policy: Policy, refresh_s: float = 10.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.source = ProfileSource(policy.profiles, policy.accelerators, refresh_s, clock)
        self.sources = (self.source,)
        self.accelerators = frozenset(policy.accelerators)
        self.default = policy.default_accelerator
        self._cache: BoundedDict[str, tuple[ObservedProfile | None, Mapping[str, Any],
                                            MergedProfile]] = BoundedDict(CACHE_LIMIT)

    def __call__(self, request: Request, decision: Decision, view: View) -> None:
        task = request.task
        book = view.sources.get("profiles")
        observed = book.profiles.get(task) if book is not None else None
        declared = request.declared
        entry = self._cache.get(task)
        if entry is None or entry[0] is not observed or entry[1] is not declared:
            merged = merge_profile(declared, observed, self.accelerators, self.default)
            entry = self._cache.put(task, (observed, declared, merged))
        merged = entry[2]
        decision.accelerator = merged.accelerator
        decision.profile = merged.record
        if merged.notes:
            decision.notes.extend(merged.notes)

    #: Nothing beyond the task name (its declaration is fixed per name) and the profile
    #: book, which the memo compares per view (see ``Pipeline.key``).
    memo_key = ()
