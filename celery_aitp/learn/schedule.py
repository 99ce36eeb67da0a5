"""The trainer as a Celery beat task, for deployments that already run ``celery beat``.

    from celery_aitp.learn.schedule import add_trainer_task
    add_trainer_task(app, every_s=600)      # after celery_aitp.install(app)

Each run is one round of ``celery aitp trainer``: it takes the trainer lock (so several
workers, a beat task, a trainer loop and ``aitp train`` never train at once; renewed while
the round trains, :mod:`celery_aitp.learn.lock`), skips the round when too
few observations arrived (unless drift asked for a retrain), and promotes only a model
that beats the baseline and the model in use, never over a pin. The worker that runs it
needs the ``train`` extra.
"""

from __future__ import annotations

from typing import Any

TASK_NAME = "celery_aitp.train_model"


def add_trainer_task(app: Any, every_s: float = 600.0, min_new: int = 100,
                     limit: int | None = None, name: str = TASK_NAME) -> Any:
    """Register the trainer task on ``app`` and schedule it every ``every_s`` seconds."""
    import celery_aitp.cli.celery_command  # noqa: F401 - it imports the trainer module last
    from celery_aitp.cli.trainer import Trainer

    trainers: dict[int, Trainer] = {}  # one per process: it remembers what it trained on

    @app.task(name=name, ignore_result=True)
    def train_model() -> None:
        """One trainer round (see :mod:`celery_aitp.learn.schedule`)."""
        import os

        trainer = trainers.get(os.getpid())
        if trainer is None:
            trainer = trainers[os.getpid()] = Trainer(app.aitp, every_s, min_new, limit)
        trainer.round()

    schedule = dict(app.conf.beat_schedule or {})
    schedule[name] = {"task": name, "schedule": float(every_s),
                      "options": {"expires": float(every_s)}}
    app.conf.beat_schedule = schedule
    return train_model
