"""``celery-aitp import-swf TRACE.swf[.gz] --out runs.jsonl``: a batch-job log as observations.

The output is what ``celery-aitp train --observations``, ``celery-aitp predict`` and
``celery-aitp replay`` read; docs/prediction.md explains the mapping.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from celery_aitp.cli.output import fail
from celery_aitp.jsonl import TRUNCATED, open_text
from celery_aitp.learn.swf import SwfResult, swf_records


@click.command("import-swf")
@click.argument("trace", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", required=True, type=click.Path(dir_okay=False),
              help="JSON-lines file to write the observation records to.")
@click.option("--start", type=float, default=None, metavar="EPOCH_S",
              help="Epoch seconds of submit time 0 (default: the header's UnixStartTime).")
def command(trace: str, out: str, start: float | None) -> None:
    """Convert a Standard Workload Format (SWF) job log into observation records."""
    result = SwfResult()
    partial = Path(f"{out}.part")  # renamed when whole: a failed run leaves no half file
    try:
        with open_text(trace) as source, open(partial, "w", encoding="utf-8") as sink:
            for record in swf_records(source, result, start):
                sink.write(json.dumps(record, separators=(",", ":")) + "\n")
        partial.replace(out)
    except (OSError, *TRUNCATED) as exc:  # unreadable, or a cut/damaged .gz
        partial.unlink(missing_ok=True)
        fail(f"cannot convert {trace}: {exc}")
    click.echo(result.summary())
