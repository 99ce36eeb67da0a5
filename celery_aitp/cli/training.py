"""What the train commands share: the progress bar, the result table, durations."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import click
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from celery_aitp.cli.output import console, table
from celery_aitp.learn.train import Report, TrainResult

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """Seconds in ``90``, ``30s``, ``10m``, ``1.5h`` or ``1d``; BadParameter otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text or "")
    if not match or float(match.group(1)) <= 0:
        raise click.BadParameter(f"{text!r}: expected a positive duration like 30s, 10m or 1h")
    return float(match.group(1)) * _UNITS[match.group(2)]


@contextmanager
def progress_bar(enabled: bool = True) -> Iterator[Report]:
    """A Report callback drawing one bar per training step (quiet when not enabled)."""
    if not enabled:
        yield lambda step, done, total: None
        return
    columns = (TextColumn("{task.description:<16}"), BarColumn(), TextColumn("{task.completed}/"
               "{task.total}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        bars: dict[str, TaskID] = {}

        def report(step: str, done: int, total: int) -> None:
            bar = bars.get(step)
            if bar is None:
                bar = bars[step] = progress.add_task(step, total=total)
            progress.update(bar, completed=done, total=total)

        yield report


def print_result(result: TrainResult) -> None:
    """The data summary, the comparison table and the promotion verdict."""
    console.print(result.dataset.summary())
    if not result.scores:
        console.print(f"[yellow]no model[/yellow]: {result.reason}")
        return
    rows = [(s.name, s.log_error, s.mae, s.median_ae, f"{s.within_2x:.1%}", s.n)
            for s in result.scores]
    table("validation (newest records, chronological split)",
          ["predictor", "log error", "MAE s", "median AE s", "within 2x", "records"], rows)
    if result.p90_coverage is not None:
        console.print(f"p90: {result.p90_coverage:.1%} of runs finished within the predicted p90")
    colour = "green" if result.promotable else "yellow"
    console.print(f"[{colour}]{result.reason}[/{colour}] (trained in {result.seconds:.1f} s)")
