"""``celery-aitp train`` and ``celery-aitp predict``: the runtime model without a Celery app.

    celery-aitp train --observations runs.jsonl --out model/
    celery-aitp predict --model model/ --observations runs.jsonl [--out predictions.jsonl]
"""

from __future__ import annotations

import json
import sys
from typing import IO

import click

from celery_aitp.cli.output import console, fail
from celery_aitp.cli.training import print_result, progress_bar
from celery_aitp.errors import AitpError
from celery_aitp.extras import require
from celery_aitp.learn.dataset import read_jsonl
from celery_aitp.learn.offline import predict_records
from celery_aitp.learn.train import train
from celery_aitp.predict.bundle import ModelBundle

_FILE = click.Path(exists=True, dir_okay=False)


@click.command("train")
@click.option("--observations", required=True, type=_FILE,
              help="JSON-lines file of observation records (schema in docs/prediction.md).")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Directory to write the model to (meta.json, p50.txt, p90.txt).")
def train_command(observations: str, out: str) -> None:
    """Train a runtime model from a file of observed runs."""
    try:
        require("train", "celery-aitp train")
        with progress_bar() as report:
            result = train(read_jsonl(observations), report=report)
    except AitpError as exc:
        fail(str(exc))
    print_result(result)
    if result.bundle is None:
        raise SystemExit(1)
    path = result.bundle.save(out)
    verdict = "promotable" if result.promotable else "not promotable (does not beat last-two)"
    console.print(f"model {result.bundle.version} written to {path}: {verdict}")


@click.command("predict")
@click.option("--model", "model_dir", required=True, type=click.Path(file_okay=False),
              help="Model directory written by `celery-aitp train` or `--out`.")
@click.option("--observations", required=True, type=_FILE,
              help="JSON-lines file of records to predict (runtime_s not needed).")
@click.option("--out", type=click.File("w"), default=None,
              help="Write the predictions here instead of standard output.")
def predict_command(model_dir: str, observations: str, out: IO[str] | None) -> None:
    """Predict p50 and p90 runtime for each record; one JSON line each, in input order."""
    try:
        bundle = ModelBundle.read(model_dir)
        predictions = predict_records(bundle, read_jsonl(observations))
    except AitpError as exc:  # a bad model, or the train extra missing
        fail(str(exc))
    sink = out or sys.stdout
    for line in predictions:
        sink.write(json.dumps(line) + "\n")
    failed = sum(1 for p in predictions if "error" in p)
    if failed:
        click.echo(f"{failed} of {len(predictions)} records could not be predicted "
                   "(see their 'error' field)", err=True)
