"""When a newly trained model may replace the one in use: one rule for every trainer.

``celery aitp train``, the ``aitp trainer`` loop, its beat task and the trainer a replay
simulates all promote by this rule, so a replay measures the promotions a deployment
would make.
"""

from __future__ import annotations

from collections.abc import Callable

from celery_aitp.errors import ModelError
from celery_aitp.learn.train import TrainResult, current_model_error
from celery_aitp.predict.model_store import ModelStore


def _quiet(message: str) -> None:
    """Says nothing (the default for callers without an operator to tell)."""


def promotion_refusal(models: ModelStore, result: TrainResult,
                      say: Callable[[str], None] = _quiet) -> str | None:
    """Why ``result``'s model must not become the one in use, or None to promote it.

    It must beat the last-two baseline, no model may be pinned, and it must have a lower
    log error (``Scores.log_error``: how many times off, not how many seconds) than the
    model in use on its own validation records (the newest). A model in use
    that cannot be read or scored (another feature schema) does not block: the new one
    already beat the baseline. ``say`` is told what was compared.
    """
    if result.bundle is None:
        return result.reason or "no model was trained"
    if not result.promotable:
        return "it does not beat the last-two baseline; the current model stays in use"
    pinned = models.pinned()
    if pinned:
        return f"model {pinned} is pinned (`aitp model unpin` lets the trainer promote again)"
    try:
        current = models.read()
        if current is None:
            return None
        current_error = current_model_error(result, current)
    except ModelError as exc:
        say(f"the current model cannot be read or scored ({exc}): compared with the "
            "baseline only")
        return None
    new_error = result.score("model").log_error
    say(f"on the same validation window: new model log error {new_error:.3g}, "
        f"current {current.version} {current_error:.3g}")
    if new_error < current_error:
        return None
    result.promotable = False
    result.reason = (f"does not beat the current model (log error {new_error:.3g} vs "
                     f"{current_error:.3g})")
    return f"the current model {current.version} is as good or better on the same window"
