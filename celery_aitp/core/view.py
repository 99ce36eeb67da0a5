"""The snapshot the publish pipeline decides on, and the interface of what fills it.

Shared by the publisher (``publish/``), the worker side and the replay simulator, so it
depends on neither: the refresher that builds snapshots is ``publish/live_view.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Protocol

from celery_aitp.policy import Policy, SplitSettings, Stage
from celery_aitp.store import RedisStore
from celery_aitp.telemetry.counters import Counters

logger = logging.getLogger(__name__)


EMPTY_SOURCES: Mapping[str, Any] = MappingProxyType({})


class Source(Protocol):
    """Shared state a stage needs on the publish path, fetched in the background.

    ``fetch`` runs in the refresher thread, never on the publish path; it gets the
    value it returned last time (or ``initial``) so it can skip work when nothing
    changed (e.g. compare a version). Its result is published in ``View.sources``.
    """

    name: str
    initial: Any

    def fetch(self, store: RedisStore, previous: Any) -> Any: ...


class View:
    """One immutable snapshot, as read by the pipeline stages."""

    __slots__ = ("live_queues", "stage", "stage_value", "split", "fresh", "model_version",
                 "fetched_at", "sources")

    def __init__(
        self,
        live_queues: frozenset[str],
        stage: Stage,
        split: SplitSettings,
        fresh: bool,
        model_version: str | None = None,
        fetched_at: float = 0.0,
        sources: Mapping[str, Any] = EMPTY_SOURCES,
    ) -> None:
        self.live_queues = live_queues
        self.stage = stage
        self.stage_value: str = stage.value  # read per publish; Enum.value is a slow property
        self.split = split
        self.fresh = fresh
        self.model_version = model_version
        self.fetched_at = fetched_at
        self.sources = sources

    def stale(self) -> View:
        """The same snapshot, marked as too old to route on."""
        return View(self.live_queues, self.stage, self.split, False, self.model_version,
                    self.fetched_at, self.sources)


def stage_from_doc(doc: Any, policy: Policy,
                   counters: Counters | None = None) -> tuple[Stage, SplitSettings]:
    """Stage and split settings from the store's document; the policy's when absent or bad
    (a bad one is logged and counted as ``rejected:stage``)."""
    if doc is None or doc == {}:
        return policy.stage, policy.split
    try:
        if type(doc) is not dict:
            raise TypeError(f"expected an object, got {type(doc).__name__}")
        stage = Stage(doc.get("stage"))
        split = SplitSettings.model_validate(doc.get("split") or {})
    except (ValueError, TypeError) as exc:
        if counters is not None:
            counters.incr("rejected:stage")
        logger.error("aitp: ignoring malformed stage document in the store (%s): %.200r",
                     str(exc).splitlines()[0] if str(exc) else type(exc).__name__, doc)
        return policy.stage, policy.split
    return stage, split
