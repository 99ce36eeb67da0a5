"""``celery aitp model``: the runtime model in use, its metrics and recent promotions."""

from __future__ import annotations

import time

import click

from celery_aitp.cli.celery_command import middleware_of
from celery_aitp.cli.output import console, emit_json, fail, table
from celery_aitp.errors import AitpError
from celery_aitp.predict.model_store import ModelStore


def _when(epoch: object) -> str:
    if not isinstance(epoch, (int, float)):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


@click.command("model")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.pass_context
def command(ctx: click.Context, as_json: bool) -> None:
    """Show the current runtime model (or that cold-start estimates are in use)."""
    models = ModelStore(middleware_of(ctx).store)
    try:
        bundle = models.read()
        history = models.history()
    except AitpError as exc:
        fail(str(exc))
    if as_json:
        meta = dict(bundle.meta) if bundle else None
        if meta:
            meta.pop("check", None)
        emit_json({"current": meta, "history": history})
        return
    if bundle is None:
        console.print("no runtime model yet: predictions are cold-start estimates "
                      "(per tenant and task); run `celery -A <app> aitp train`")
        return
    meta = bundle.meta
    window = meta.get("window") or {}
    console.print(f"model [bold]{bundle.version}[/bold], trained {_when(meta.get('trained_at'))} "
                  f"on {meta.get('records', {}).get('used', '?')} runs published "
                  f"{_when(window.get('from'))} .. {_when(window.get('to'))}")
    metrics = meta.get("metrics") or {}
    rows = [(name, m.get("mae"), m.get("median_ae"), f"{m.get('within_2x', 0):.1%}")
            for name, m in metrics.items() if isinstance(m, dict)]
    table("validation", ["predictor", "MAE s", "median AE s", "within 2x"], rows)
    table("promotions", ["version", "trained", "records"],
          [(h.get("version"), _when(h.get("trained_at")), (h.get("records") or {}).get("used"))
           for h in history])
