"""``celery aitp model``: the runtime model in use, its metrics and recent promotions;
``pin VERSION``, ``rollback`` and ``unpin`` (each audited: who, when, why, from where)."""

from __future__ import annotations

import math
import time

import click

from celery_aitp.cli.celery_command import middleware_of
from celery_aitp.cli.output import console, emit_json, fail, table
from celery_aitp.errors import AitpError
from celery_aitp.predict.drift import BOUND, MIN_RUNS, DriftStore
from celery_aitp.predict.model_store import Actor, ModelStore


def _when(epoch: object) -> str:
    if not isinstance(epoch, (int, float)):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


@click.group("model", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.pass_context
def command(ctx: click.Context, as_json: bool) -> None:
    """Show the current runtime model (or that cold-start estimates are in use)."""
    if ctx.invoked_subcommand is not None:
        return
    models = ModelStore(middleware_of(ctx).store)
    try:
        bundle = models.read()
        history = models.history()
        pinned, kept, audit = models.pinned(), models.kept(), models.audit()
    except AitpError as exc:
        fail(str(exc))
    if as_json:
        meta = dict(bundle.meta) if bundle else None
        if meta:
            meta.pop("check", None)
        emit_json({"current": meta, "history": history, "pinned": pinned, "kept": kept,
                   "audit": audit, "drift": {task: {"error": avg, "runs": runs}
                                             for task, (avg, runs) in
                                             DriftStore(models.store).read().items()}})
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
    rows = [(name, m.get("log_error"), m.get("mae"), m.get("median_ae"),
             f"{m.get('within_2x', 0):.1%}")
            for name, m in metrics.items() if isinstance(m, dict)]
    table("validation", ["predictor", "log error", "MAE s", "median AE s", "within 2x"], rows)
    table("promotions", ["version", "trained", "records"],
          [(h.get("version"), _when(h.get("trained_at")), (h.get("records") or {}).get("used"))
           for h in history])
    show_drift(models)
    console.print(f"kept for pin/rollback: {', '.join(kept) or 'none'}"
                  + (f"; [bold]pinned[/bold]: {pinned}" if pinned else ""))
    if audit:
        table("pins and rollbacks", ["when", "action", "version", "from", "who", "where", "why"],
              [(_when(a.get("at")), a.get("action"), a.get("version"), a.get("from_version"),
                a.get("who"), a.get("where"), a.get("why")) for a in audit])


def show_drift(models: ModelStore) -> None:
    """Live error per task; those beyond the bound are predicted from history."""
    try:
        averages = DriftStore(models.store).read()
    except AitpError:
        return
    if not averages:
        return
    rows = [(task, f"{math.exp(avg):.2f}x", runs,
             "history (drift)" if runs >= MIN_RUNS and avg > BOUND else "model")
            for task, (avg, runs) in sorted(averages.items(), key=lambda kv: -kv[1][0])]
    table(f"live error per task (typical miss; beyond {math.exp(BOUND):.0f}x over "
          f"{MIN_RUNS}+ runs: history)", ["task", "typical miss", "runs", "predicted by"], rows)


_REASON = click.option("--reason", required=True, help="Why (kept in the audit trail).")
_BY = click.option("--by", "who", default=None,
                   help="Who, for the audit trail (default: the login user).")


@command.command("pin")
@click.argument("version")
@_REASON
@_BY
@click.pass_context
def pin(ctx: click.Context, version: str, reason: str, who: str | None) -> None:
    """Make a kept model current and keep it there (the trainer does not promote over it)."""
    models = ModelStore(middleware_of(ctx).store)
    try:
        previous = models.pin(version, Actor.here(reason, who))
    except AitpError as exc:
        fail(str(exc))
    console.print(f"pinned model {version} (was {previous or 'none'}); producers and workers "
                  "pick it up within seconds")


@command.command("rollback")
@_REASON
@_BY
@click.pass_context
def rollback(ctx: click.Context, reason: str, who: str | None) -> None:
    """Go back to the kept model before the current one, and pin it."""
    models = ModelStore(middleware_of(ctx).store)
    try:
        target = models.rollback(Actor.here(reason, who))
    except AitpError as exc:
        fail(str(exc))
    console.print(f"rolled back to model {target} (pinned; `aitp model unpin` lets the "
                  "trainer promote again)")


@command.command("unpin")
@_REASON
@_BY
@click.pass_context
def unpin(ctx: click.Context, reason: str, who: str | None) -> None:
    """Let the trainer promote better models again."""
    models = ModelStore(middleware_of(ctx).store)
    try:
        was = models.unpin(Actor.here(reason, who))
    except AitpError as exc:
        fail(str(exc))
    console.print(f"unpinned (was {was or 'not pinned'})")
