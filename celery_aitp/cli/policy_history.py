"""``celery aitp policy``: the active policy's digest and every recorded change."""

from __future__ import annotations

import time

import click

from celery_aitp.cli.celery_command import middleware_of
from celery_aitp.cli.output import console, emit_json, fail, table
from celery_aitp.errors import AitpError
from celery_aitp.policy_history import policy_history


@click.command("policy")
@click.option("--limit", default=20, show_default=True, help="History entries to show.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (with full policies).")
@click.pass_context
def command(ctx: click.Context, limit: int, as_json: bool) -> None:
    """Show this app's policy digest and the history of active-policy changes."""
    mw = middleware_of(ctx)
    try:
        history = policy_history(mw.store, limit)
    except AitpError as exc:
        fail(str(exc))
    if as_json:
        emit_json({"digest": mw.policy_digest, "source": mw.policy_origin(),
                   "history": history})
        return
    console.print(f"this app's policy: [bold]{mw.policy_digest}[/bold] ({mw.policy_origin()})")
    table("policy changes, newest first", ["at", "digest", "source", "host", "pid"],
          [(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h.get("at", 0))),
            h.get("digest"), h.get("source"), h.get("host"), h.get("pid")) for h in history])
