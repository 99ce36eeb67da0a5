"""What the publish path knows about a task (Request) and what it decides (Decision).

Both are plain slotted classes, not pydantic models: they are built for every task and
must cost well under a microsecond. Stages fill a Decision in, in pipeline order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Bump when the ``aitp`` header changes shape; readers accept older versions.
HEADER_VERSION = 1


class Request:
    """A task about to be published, as Celery hands it to us."""

    __slots__ = (
        "task", "task_id", "args", "kwargs", "headers", "declared",
        "explicit_queue", "published_at", "retries", "parent_tenant",
    )

    def __init__(
        self,
        task: str,
        task_id: str,
        args: Any = (),
        kwargs: Any = None,
        headers: Mapping[str, Any] | None = None,
        declared: Mapping[str, Any] | None = None,
        explicit_queue: str | None = None,
        published_at: float = 0.0,
        retries: int = 0,
        parent_tenant: str | None = None,
    ) -> None:
        self.task = task
        self.task_id = task_id
        self.args = args
        self.kwargs = kwargs if kwargs is not None else {}
        self.headers = headers if headers is not None else {}
        self.declared = declared if declared is not None else {}
        self.explicit_queue = explicit_queue
        self.published_at = published_at
        self.retries = retries
        # tenant of the task running in this worker process, if this one is published
        # from inside it (a chain step, a chord body, a sub-task); already validated
        self.parent_tenant = parent_tenant


class Decision:
    """The route chosen for one task, and why. Becomes the ``aitp`` message header."""

    __slots__ = (
        "task", "task_id", "tenant", "tier", "accelerator", "features", "predicted_runtime_s",
        "predicted_p90_s", "prediction_source", "profile", "score", "factors",
        "queue", "routed", "reason", "stage", "arm", "decided_at", "notes",
        "tier_steps", "origin_at",
    )

    def __init__(self, stage: str, decided_at: float, task: str = "", task_id: str = "") -> None:
        self.task = task
        self.task_id = task_id
        self.tenant: str = ""
        self.tier: str = ""
        self.accelerator: str = ""
        self.features: dict[str, Any] = {}
        self.predicted_runtime_s: float | None = None
        self.predicted_p90_s: float | None = None
        self.prediction_source: str | None = None
        self.profile: dict[str, Any] | None = None
        self.score: float | None = None
        self.factors: dict[str, float] | None = None
        self.queue: str | None = None  # the tier queue chosen (or that would be, in shadow)
        self.routed: bool = False
        self.reason: str = "undecided"
        self.stage: str = stage
        self.arm: str | None = None  # 'routed' or 'standard' in the split stage
        self.decided_at: float = decided_at
        self.notes: list[str] = []  # counted anomalies, e.g. 'tenant_unknown'
        self.tier_steps: dict[str, Any] | None = None  # how the score became the tier
        self.origin_at: float | None = None  # first publish of this task (kept by retries)

    def fall_back(self, reason: str) -> Decision:
        """Send the task down Celery's own path, keeping what was decided for the record."""
        self.routed = False
        self.reason = reason
        return self

    def header(self) -> dict[str, Any]:
        """The JSON-safe ``aitp`` header carried by the message."""
        return {
            "v": HEADER_VERSION,
            "tenant": self.tenant,
            "tier": self.tier,
            "accelerator": self.accelerator,
            "predicted_runtime_s": self.predicted_runtime_s,
            "predicted_p90_s": self.predicted_p90_s,
            "stage": self.stage,
            "routed": self.routed,
            "queue": self.queue,
            "reason": self.reason,
            "arm": self.arm,
            "score": self.score,
            "decided_at": self.decided_at,
            "origin_at": self.origin_at,
        }

    def record(self) -> dict[str, Any]:
        """The decision as stored for comparison and ``explain`` (header plus details)."""
        record = self.header()
        record.update(task=self.task, task_id=self.task_id, factors=self.factors,
                      profile=self.profile, prediction_source=self.prediction_source,
                      tier_steps=self.tier_steps)
        return record
