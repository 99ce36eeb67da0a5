"""The publish-time decision as an ordered list of small stages, one module each.

Order (one way only, ``pipeline.STAGE_ORDER``): tenant -> features -> predict ->
profile -> priority -> route -> gate -> spill -> visibility, each in
``publish/<name>_stage.py`` (features and predict both in ``predict_stage.py``).
Each stage reads the Request, the shared View and what earlier stages wrote into the
Decision, and fills in its own part. A stage's implementation is replaced by handing
:class:`~celery_aitp.publish.pipeline.Pipeline` another callable with the same signature;
nothing else changes.
"""

from __future__ import annotations

from typing import Protocol

from celery_aitp.core.request import Decision, Request
from celery_aitp.core.view import View

__all__ = ["PublishStage"]


class PublishStage(Protocol):
    """One step of the decision. Must be fast and may raise: the hook falls back."""

    name: str

    def __call__(self, request: Request, decision: Decision, view: View) -> None: ...
