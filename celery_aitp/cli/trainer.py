"""``celery aitp trainer --every 10m``: retrain periodically, promote only improvements.

One trainer trains at a time (a lock in the store, renewed while a round trains and
released only by its holder: :mod:`celery_aitp.learn.lock`), so several can run for
availability; ``celery aitp train`` takes the same lock.
A round is skipped when fewer than ``--min-new`` observations arrived since the last one.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import click

from celery_aitp.cli.celery_command import middleware_of
from celery_aitp.cli.output import console, fail
from celery_aitp.cli.train import train_and_promote
from celery_aitp.cli.training import parse_duration
from celery_aitp.errors import AitpError
from celery_aitp.extras import require
from celery_aitp.learn.lock import TTL_S as LOCK_TTL_S
from celery_aitp.learn.lock import TrainerLock
from celery_aitp.learn.observations import count_after, last_id
from celery_aitp.predict.drift import DriftStore
from celery_aitp.predict.model_store import ModelStore
from celery_aitp.redact import redact


class Trainer:
    """The loop, separate from click so it can be stopped and tested."""

    def __init__(self, middleware: Any, every_s: float, min_new: int, limit: int | None) -> None:
        self.middleware = middleware
        self.every_s = every_s
        self.min_new = min_new
        self.limit = limit
        self.stop = threading.Event()
        #: Expiry of the trainer lock; it is renewed while a round runs.
        self.lock_ttl_s = LOCK_TTL_S
        self._seen: str | None = None  # id of the newest observation when it last trained

    def due(self) -> str | None:
        """Why this round is skipped, or None when there is something new to learn from.

        New observations are counted by stream entry id after the newest one the last
        round trained on: the stream is capped (``AITP_OBSERVATION_MAXLEN``), so once it
        is full its length no longer grows, and counting by length saw none arrive."""
        store = self.middleware.store
        newest = last_id(store)
        if newest is None:
            return "no observations yet"
        pinned = ModelStore(store).pinned()
        if pinned:  # nothing could be promoted; what arrives meanwhile counts after unpin
            return f"model {pinned} is pinned (`aitp model unpin` lets the trainer promote)"
        asked = DriftStore(store).take_due()
        if asked:  # a task's live error crossed the bound: retrain now
            console.print(f"retraining: {asked}")
            self._seen = newest
            return None
        seen = self._seen
        if newest == seen:
            return "no new observations"
        if seen is not None and self.min_new > 0:
            new = count_after(store, seen, self.min_new)
            if new < self.min_new:
                return f"only {new} new observations (--min-new {self.min_new})"
        self._seen = newest
        return None

    def round(self) -> None:
        lock = TrainerLock(self.middleware.store, self.lock_ttl_s)
        if not lock.acquire():
            console.print(f"another trainer holds the lock ({lock.holder() or 'expired'}); "
                          "skipping this round")
            return
        try:
            skip = self.due()
            if skip:
                console.print(f"{time.strftime('%H:%M:%S')} skipped: {skip}")
                return
            train_and_promote(self.middleware, None, self.limit, None, False,
                              show_progress=False)
        finally:
            lock.release()  # only if still ours: never the next trainer's lock
            if lock.lost:
                console.print("[yellow]the trainer lock expired during this round[/yellow] "
                              "(store unreachable for longer than its expiry?)")

    def run(self, rounds: int | None = None) -> None:
        done = 0
        while not self.stop.is_set():
            try:
                self.round()
            except AitpError as exc:
                console.print(f"[red]round failed[/red]: {redact(exc)}; retrying next round")
            done += 1
            if rounds is not None and done >= rounds:
                return
            self.stop.wait(self.every_s)


@click.command("trainer")
@click.option("--every", "every", default="10m", show_default=True,
              help="Time between rounds: 30s, 10m, 1h, ...")
@click.option("--min-new", type=click.IntRange(min=0), default=100, show_default=True,
              help="Retrain only after this many new observations.")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="Train on the newest N observations only.")
@click.option("--rounds", type=click.IntRange(min=1), default=None, hidden=True)
@click.pass_context
def command(ctx: click.Context, every: str, min_new: int, limit: int | None,
            rounds: int | None) -> None:
    """Retrain the runtime model periodically; promote only models that beat last-two."""
    every_s = parse_duration(every)
    try:
        require("train", "celery aitp trainer")
    except AitpError as exc:
        fail(str(exc))
    console.print(f"trainer: every {every_s:g} s (Ctrl-C to stop)")
    try:
        Trainer(middleware_of(ctx), every_s, min_new, limit).run(rounds)
    except KeyboardInterrupt:
        console.print("trainer stopped")
