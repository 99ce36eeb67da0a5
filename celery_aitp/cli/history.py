"""``celery aitp history``: the audit log of stage changes, newest first."""

from __future__ import annotations

import click

from celery_aitp.cli.celery_command import middleware_of
from celery_aitp.cli.output import emit_json, fail, table
from celery_aitp.errors import AitpError
from celery_aitp.migration.describe import describe_doc, when


@click.command("history")
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True,
              help="How many changes to show.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def command(ctx: click.Context, limit: int, as_json: bool) -> None:
    """Every stage change: when, who and from where, old and new, and why."""
    mw = middleware_of(ctx)
    try:
        entries = mw.store.stage_history(limit)
    except AitpError as exc:
        fail(str(exc))
    if as_json:
        emit_json(entries)
        return
    table("stage history (newest first)", ["time", "who", "old", "new", "why"],
          [(when(e.get("at")), e.get("who"), describe_doc(e.get("old")),
            describe_doc(e.get("new")), e.get("why")) for e in entries])
