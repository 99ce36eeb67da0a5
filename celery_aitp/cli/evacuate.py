"""``celery aitp evacuate``: move waiting tier-queue messages to the default queue now."""

from __future__ import annotations

import click

from celery_aitp.cli.celery_command import middleware_of
from celery_aitp.cli.output import console, fail
from celery_aitp.errors import AitpError
from celery_aitp.queues import parse_tier_queue
from celery_aitp.worker.janitor import Janitor


@click.command("evacuate")
@click.option("--all", "everything", is_flag=True,
              help="Drain every tier queue, even those with live consumers (rollback).")
@click.option("--queue", "queues", multiple=True, help="Drain only this tier queue (repeat).")
@click.pass_context
def command(ctx: click.Context, everything: bool, queues: tuple[str, ...]) -> None:
    """Drain orphaned tier queues (or all, or the named ones) atomically."""
    janitor = Janitor(middleware_of(ctx))
    layout = janitor.middleware.layout
    others = [q for q in queues  # a logical name, or the broker queue holding it
              if parse_tier_queue(q) is None and not layout.is_tier_destination(q)]
    if others:  # a queue of the app's own: moving it would reroute what it holds
        fail(f"--queue: not a tier queue: {', '.join(others)} (evacuate moves only "
             "aitp.<tenant>.<accelerator>.<tier> queues to the default queue)")
    try:
        if queues or everything:
            moved = janitor.evacuate(queues or janitor.every_queue())
        else:
            moved = janitor.sweep()
    except AitpError as exc:
        fail(str(exc))
    total = sum(moved.values())
    for queue, n in sorted(moved.items()):
        console.print(f"{queue}: moved {n}")
    console.print(f"moved {total} message(s) to {janitor.middleware.default_queue}")
