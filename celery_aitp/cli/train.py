"""``celery aitp train``: learn the runtime model from observed runs and promote it."""

from __future__ import annotations

from typing import Any

import click

from celery_aitp.cli.celery_command import middleware_of
from celery_aitp.cli.output import console, fail
from celery_aitp.cli.training import print_result, progress_bar
from celery_aitp.errors import AitpError
from celery_aitp.extras import require
from celery_aitp.learn.dataset import read_jsonl
from celery_aitp.learn.lock import TrainerLock
from celery_aitp.learn.observations import store_records
from celery_aitp.learn.promotion import promotion_refusal
from celery_aitp.learn.train import TrainConfig, TrainResult, train
from celery_aitp.predict.model_store import ModelStore

#: Fewest records ``--min-records`` allows: the newest 20% validate the model, and a
#: model keeps 8 of them as check rows (with 20 to 39 it failed with an internal error).
MIN_RECORDS_FLOOR = 40
#: Exit status of ``aitp train`` when another trainer holds the trainer lock.
LOCK_HELD_EXIT = 3


def train_and_promote(middleware: Any, observations: str | None, limit: int | None,
                      out: str | None, dry_run: bool, show_progress: bool = True,
                      config: TrainConfig | None = None) -> TrainResult:
    """Train from a file or the store; promote when the model beats the last-two baseline
    and the model in use, unless a model is pinned."""
    records = read_jsonl(observations) if observations else store_records(middleware.store,
                                                                          limit)
    with progress_bar(show_progress) as report:
        result = train(records, config, report=report)
    print_result(result)
    if result.bundle is None:
        return result
    if out:
        console.print(f"model written to {result.bundle.save(out)}")
    models = ModelStore(middleware.store)
    if dry_run:
        console.print("dry run: not promoted")
        return result
    refusal = promotion_refusal(models, result, say=console.print)
    if refusal:
        console.print(f"[yellow]not promoted[/yellow]: {refusal}")
        return result
    pinned = models.promote(result.bundle, unless_pinned=True)
    if pinned:  # pinned while the new model was compared with the one in use
        console.print(f"[yellow]pinned meanwhile: not promoted[/yellow] (model {pinned} "
                      "is pinned; `aitp model unpin` lets the trainer promote again)")
        return result
    console.print(f"[green]promoted[/green] model {result.bundle.version}; producers and "
                  "workers pick it up within seconds")
    return result


@click.command("train")
@click.option("--observations", type=click.Path(exists=True, dir_okay=False),
              help="Train from this JSON-lines file instead of the store's observations.")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="Use only the newest N observations of the store.")
@click.option("--out", type=click.Path(file_okay=False), help="Also write the model here.")
@click.option("--dry-run", is_flag=True, help="Train and report, but do not promote.")
@click.option("--min-records", type=click.IntRange(min=MIN_RECORDS_FLOOR),
              default=TrainConfig.min_records,
              show_default=True, help="Train only with at least this many usable records.")
@click.pass_context
def command(ctx: click.Context, observations: str | None, limit: int | None, out: str | None,
            dry_run: bool, min_records: int) -> None:
    """Train the runtime model; promote it if it beats the last-two baseline.

    Takes the trainer lock (as ``aitp trainer`` rounds do) unless ``--dry-run``; exits
    3 when another trainer holds it. Exits 1 when no model could be trained (too few
    usable records), as ``celery-aitp train`` does, so a scheduled job sees it."""
    lock = None
    try:
        require("train", "celery aitp train")
        middleware = middleware_of(ctx)
        if not dry_run:
            taken = TrainerLock(middleware.store)
            if not taken.acquire():
                fail(f"another trainer holds the trainer lock ({taken.holder() or 'expired'}"
                     "): not trained; try again when its round ends", code=LOCK_HELD_EXIT)
            lock = taken
        result = train_and_promote(middleware, observations, limit, out, dry_run,
                                   config=TrainConfig(min_records=min_records))
    except (AitpError, OSError) as exc:
        fail(str(exc))
    finally:
        if lock is not None:
            lock.release()
    if result.bundle is None:
        raise SystemExit(1)

