"""Every key the shared store uses, in one place, under one prefix.

Nothing here grows without bound: advertisements are scored by expiry and pruned,
streams are capped, lists are trimmed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    """Key names for one deployment (``prefix`` separates deployments and test runs)."""

    prefix: str = "aitp"

    def _k(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    @property
    def consumers(self) -> str:
        """ZSET of '<queue>|<worker>' scored by the advertisement's expiry time (Unix
        seconds by the Redis server's clock)."""
        return self._k("consumers")

    @property
    def workers(self) -> str:
        """HASH worker -> JSON description (queues, tenants, accelerator, heartbeat: Unix
        seconds by the Redis server's clock)."""
        return self._k("workers")

    @property
    def stage(self) -> str:
        """HASH with the live stage and split settings (JSON in field 'doc')."""
        return self._k("stage")

    @property
    def stage_history(self) -> str:
        """LIST of stage changes, newest first, trimmed."""
        return self._k("stage", "history")

    @property
    def counters(self) -> str:
        """HASH of fleet-wide counters (fallback reasons, dropped records, ...)."""
        return self._k("counters")

    @property
    def observations(self) -> str:
        """STREAM of observed runs, capped."""
        return self._k("obs")

    @property
    def decisions(self) -> str:
        """STREAM of publish-time decisions (shadow records), capped."""
        return self._k("decisions")

    @property
    def model(self) -> str:
        """HASH with the current runtime model: version, text, meta."""
        return self._k("model")

    @property
    def policy_history(self) -> str:
        """LIST of active-policy changes (time, source, digest), trimmed."""
        return self._k("policy", "history")

    @property
    def janitor_lock(self) -> str:
        """Short lock so one process at a time drains orphaned queues."""
        return self._k("lock", "janitor")

    @property
    def aging_lock(self) -> str:
        """Short lock so one process at a time runs RabbitMQ aging passes."""
        return self._k("lock", "aging")

    @property
    def feedback_lock(self) -> str:
        """Short lock so one process at a time adjusts the feedback boosts."""
        return self._k("lock", "feedback")

    def any(self, *parts: str) -> str:
        """A key under the prefix for a component that owns its own keys."""
        return self._k(*parts)
