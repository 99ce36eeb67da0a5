"""``celery aitp age``: run one RabbitMQ aging pass now, instead of waiting for a worker's."""

from __future__ import annotations

import click

from celery_aitp.cli.celery_command import middleware_of
from celery_aitp.cli.output import console, fail
from celery_aitp.errors import AitpError
from celery_aitp.worker import aging


@click.command("age")
@click.pass_context
def command(ctx: click.Context) -> None:
    """Promote waiting messages older than their tier's promote_after_s (RabbitMQ)."""
    mw = middleware_of(ctx)
    try:
        if not aging.enabled(mw.policy, mw.broker_driver):
            fail("aging passes run on RabbitMQ with tier_order: weighted; this app's broker "
                 f"is {mw.broker_driver!r} with tier_order: {mw.policy.tier_order.value} "
                 "(on Redis the workers' weighted tier order keeps lower tiers moving)")
        # a worker's pass holds the lock for most of each interval: wait one out
        wait_s = mw.policy.aging.interval_s + 1.0
        promoted = aging.Ager(mw).pass_now(wait_s)
    except AitpError as exc:
        fail(str(exc))
    if promoted is None:
        fail(f"another aging pass held the lock for {wait_s:g} s (another `aitp age`?); "
             "try again")
    for queue, n in sorted(promoted.items()):
        console.print(f"{queue}: promoted {n}")
    console.print(f"promoted {sum(promoted.values())} message(s) to their tenant's top "
                  "allowed priority")
