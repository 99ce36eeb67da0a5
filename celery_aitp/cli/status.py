"""``celery aitp status``: stage, live workers and queue depths at a glance."""

from __future__ import annotations

import time

import click

from celery_aitp.cli.celery_command import middleware_of
from celery_aitp.cli.output import console, emit_json, fail, table
from celery_aitp.errors import AitpError
from celery_aitp.publish.live_view import stage_from_doc


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.pass_context
def command(ctx: click.Context, as_json: bool) -> None:
    """Show the live stage, the workers serving tier queues, and counters."""
    mw = middleware_of(ctx)
    try:
        stage, split = stage_from_doc(mw.store.read_stage(), mw.policy)
        workers = mw.store.workers()
        counts = mw.store.counts()
    except AitpError as exc:
        fail(str(exc))
    if as_json:
        emit_json({"stage": stage.value, "split": split.model_dump(), "workers": workers,
                   "counters": counts})
        return
    console.print(f"stage: [bold]{stage.value}[/bold]" +
                  (f" (split {split.percent:g}%)" if stage.value == "split" else ""))
    now = time.time()
    table("workers", ["worker", "accelerator", "tenants", "tiers", "heartbeat age s"],
          [(w.get("worker"), w.get("accelerator"), ",".join(w.get("tenants", [])),
            ",".join(w.get("tiers", [])), now - float(w.get("heartbeat", now))) for w in workers])
    table("counters", ["counter", "count"], sorted(counts.items()))
