"""Commands that work with or without a Celery app (shared by both entry points)."""

from __future__ import annotations

import click

from celery_aitp.cli.output import console, fail
from celery_aitp.errors import PolicyError
from celery_aitp.policy import read_policy_file


@click.command("validate")
@click.argument("policy_file", type=click.Path(dir_okay=False))
def validate(policy_file: str) -> None:
    """Check a policy file; print every invalid field by its path, exit 1 if any."""
    try:
        policy = read_policy_file(policy_file)
    except PolicyError as exc:
        for line in str(exc).splitlines():
            click.echo(f"invalid: {line}", err=True)
        raise SystemExit(1) from None
    tiers = ", ".join(f"{t.name} ({t.sla_s:g}s)" for t in policy.tiers)
    console.print(f"[green]valid[/green]: {len(policy.tenants)} tenant(s); tiers {tiers}; "
                  f"accelerators {', '.join(policy.accelerators)}; stage {policy.stage.value}")


__all__ = ["fail", "validate"]
