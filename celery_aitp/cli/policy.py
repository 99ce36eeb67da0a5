"""``celery aitp policy``: the policy the fleet decides by, its versions, and changing it live.

``policy`` alone (or ``policy history``) shows this app's digest and every change;
``apply FILE --reason`` makes a validated file the active policy for every producer and
worker within their refresh interval; ``diff`` shows what a file (or a version) would
change; ``rollback`` applies the version before the active one again. Each change is
audited in the history: who, when, from which host, why. Tiers change only by a rolling
restart with the new file, then ``apply`` of it. See :mod:`celery_aitp.policy_live`.
"""

from __future__ import annotations

import time
from typing import Any

import click

from celery_aitp.cli.celery_command import middleware_of
from celery_aitp.cli.output import console, emit_json, fail, table
from celery_aitp.errors import AitpError
from celery_aitp.policy import Policy, parse_policy, read_policy_file
from celery_aitp.policy_history import policy_digest, policy_history
from celery_aitp.policy_live import (
    ROLLBACK,
    active_policy,
    apply_policy,
    policy_diff,
    rollback_target,
)


def _fleet_policy(mw: Any) -> Policy:
    """What the fleet decides by: the applied policy, else this app's own."""
    return active_policy(mw.store) or mw.policy


def _show(ctx: click.Context, limit: int, as_json: bool) -> None:
    mw = middleware_of(ctx, follow_applied=False)
    try:
        history = policy_history(mw.store, limit)
        fleet = policy_digest(_fleet_policy(mw))
    except AitpError as exc:
        fail(str(exc))
    if as_json:
        emit_json({"digest": mw.policy_digest, "source": mw.policy_origin(),
                   "active": fleet, "history": history})
        return
    console.print(f"this app's policy: [bold]{mw.policy_digest}[/bold] ({mw.policy_origin()})")
    console.print(f"the fleet's active policy: [bold]{fleet}[/bold]")
    table("policy changes, newest first",
          ["at", "digest", "action", "who", "reason", "source", "host", "pid"],
          [(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h.get("at", 0))),
            h.get("digest"), h.get("action", "start"), h.get("who", ""), h.get("reason", ""),
            h.get("source"), h.get("host"), h.get("pid")) for h in history])


@click.group("policy", invoke_without_command=True)
@click.option("--limit", default=20, show_default=True, help="History entries to show.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (with full policies).")
@click.pass_context
def command(ctx: click.Context, limit: int, as_json: bool) -> None:
    """The active policy, its history, and live changes (apply, diff, rollback)."""
    if ctx.invoked_subcommand is None:
        _show(ctx, limit, as_json)


@command.command("history")
@click.option("--limit", default=20, show_default=True, help="History entries to show.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (with full policies).")
@click.pass_context
def history_command(ctx: click.Context, limit: int, as_json: bool) -> None:
    """Every change of the active policy, newest first (who, when, why, digest)."""
    _show(ctx, limit, as_json)


@command.command("apply")
@click.argument("policy_file", type=click.Path(dir_okay=False))
@click.option("--reason", default="", help="Why (kept in the history).")
@click.pass_context
def apply_command(ctx: click.Context, policy_file: str, reason: str) -> None:
    """Validate POLICY_FILE and make it the policy every producer and worker decides by."""
    mw = middleware_of(ctx, follow_applied=False)
    try:
        policy = read_policy_file(policy_file)
        current = _fleet_policy(mw)
        if policy_digest(policy) == policy_digest(current):
            console.print(f"unchanged: the active policy is already {policy_digest(policy)}")
            return
        entry = apply_policy(mw.store, policy, current, source=f"file {policy_file}",
                             reason=reason)
    except AitpError as exc:
        fail(str(exc))
    console.print(f"applied [bold]{entry['digest']}[/bold] (was {policy_digest(current)}); "
                  f"producers and workers follow within "
                  f"{mw.settings.refresh_interval_s:g} s")
    _note_tiers(policy, current)


@command.command("diff")
@click.argument("target")
@click.pass_context
def diff_command(ctx: click.Context, target: str) -> None:
    """What TARGET (a policy file, or a digest from the history) changes from the active
    policy, as a unified diff; exit 1 if it differs."""
    mw = middleware_of(ctx, follow_applied=False)
    try:
        current = _fleet_policy(mw)
        if target.endswith((".yaml", ".yml", ".json")):
            other, name = read_policy_file(target), target
        else:
            other, name = parse_policy(rollback_target(mw.store, target)["policy"]), target
    except AitpError as exc:
        fail(str(exc))
    text = policy_diff(current, other, f"active {policy_digest(current)}", name)
    if not text:
        console.print("no difference")
        return
    click.echo(text, nl=False)
    raise SystemExit(1)


@command.command("rollback")
@click.option("--to", "to_digest", default=None, help="A digest from the history "
              "(default: the version before the active one).")
@click.option("--reason", default="", help="Why (kept in the history).")
@click.pass_context
def rollback_command(ctx: click.Context, to_digest: str | None, reason: str) -> None:
    """Apply an earlier version again (audited as a rollback)."""
    mw = middleware_of(ctx, follow_applied=False)
    try:
        current = _fleet_policy(mw)
        target = rollback_target(mw.store, to_digest)
        policy = parse_policy(target["policy"])
        if policy_digest(policy) == policy_digest(current):
            console.print(f"unchanged: the active policy is already {target['digest']}")
            return
        entry = apply_policy(mw.store, policy, current, source=f"rollback to {target['digest']}",
                             reason=reason, action=ROLLBACK)
    except AitpError as exc:
        fail(str(exc))
    console.print(f"rolled back to [bold]{entry['digest']}[/bold] "
                  f"(was {policy_digest(current)})")
    _note_tiers(policy, current)


def _note_tiers(new: Policy, old: Policy) -> None:
    """After a change of tiers (accepted because processes started with them): who
    follows and who does not."""
    if new.tier_names != old.tier_names:
        console.print(f"tiers {', '.join(new.tier_names)} (were {', '.join(old.tier_names)}): "
                      "only processes started with these tiers follow; the others keep "
                      "their policy until restarted with the new file", soft_wrap=True)
