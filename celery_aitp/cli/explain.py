"""``celery aitp explain TASK_ID``: each factor, its weight, the profile, the prediction and
the route of one task (like Slurm's ``sprio`` for a job)."""

from __future__ import annotations

from typing import Any

import click

from celery_aitp.cli.celery_command import middleware_of
from celery_aitp.cli.output import console, emit_json, fail, table
from celery_aitp.core.request import EXPLICIT_QUEUE, MODEL_PREDICTION
from celery_aitp.errors import AitpError
from celery_aitp.explain import explain_task, tier_story


@click.command("explain")
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.pass_context
def command(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """Explain the latest decision recorded for TASK_ID."""
    mw = middleware_of(ctx)
    try:
        data = explain_task(mw, task_id)
    except AitpError as exc:
        fail(str(exc))
    if data is None:
        fail(f"no decision recorded for task {task_id!r} (decisions are kept for the last "
             f"{mw.settings.decision_maxlen} publishes; records reach the store within "
             f"{mw.settings.refresh_interval_s:g} s)", code=1)
        return
    if as_json:
        emit_json(data)
        return
    _render(data, mw.default_queue)


def _render(data: dict[str, Any], default_queue: str) -> None:
    route = data["route"]
    console.print(f"task [bold]{data['task_id']}[/bold] {data['task']}  tenant "
                  f"[bold]{data['tenant']}[/bold]  stage {route['stage']}")
    if data.get("tenant_note"):
        console.print(f"tenant: {data['tenant_note']}")
    if route["routed"]:
        console.print(f"route: [green]{route['queue']}[/green] (routed)")
    elif route["reason"] == EXPLICIT_QUEUE:
        console.print("route: the queue it was sent to (someone named it, or a retry stays "
                      f"in the tier queue it came from); would be {route['would_queue']}")
    else:
        console.print(f"route: Celery's own route (default queue {default_queue}); "
                      f"reason [yellow]{route['reason']}[/yellow]; would be "
                      f"{route['would_queue']}")
    table("urgency factors", ["factor", "value", "weight", "contribution"],
          [(r["factor"], r["value"], r["weight"], r["contribution"]) for r in data["factors"]])
    console.print(f"urgency {_num(data['score'])} (the size counts "
                  f"{_num(data['urgency_range'])} ** urgency times shorter)")
    console.print(tier_story(data["tier_steps"], data["tier"], data["tiers"]))
    profile = data["profile"] or {}
    sources = profile.get("sources") or {}
    table("profile", ["resource", "value", "from"],
          [(k, profile.get(k, "-"), sources.get(k, "unknown")) for k in
           ("accelerator", "cpu_s", "cpu_cores", "memory_mb")] +
          [("runs observed", profile.get("runs"), ""),
           ("accelerator share", profile.get("accelerator_share"), "")])
    pred = data["prediction"]
    if pred["p50_s"] is None and pred["p90_s"] is None:
        console.print("prediction: none (the runtime factor is neutral or from a hint)")
    else:
        console.print(f"prediction: p50 {_num(pred['p50_s'])} s, p90 {_num(pred['p90_s'])} s "
                      f"({pred['source'] or 'unknown source'}); {_size_rule(data)}")
    if data["note"]:
        console.print(f"[yellow]note[/yellow]: {data['note']}")


def _size_rule(data: dict[str, Any]) -> str:
    """Which figure of the prediction the task was placed by (the priority stage's
    ``_size_of``: a model's at the policy's quantile, anything else by its p90 field)."""
    if data["prediction"]["source"] != MODEL_PREDICTION:
        return "placed by the p90"  # a cold-start bound, or a hint
    quantile = data["size_quantile"]
    return "placed by the median" if quantile == 0.5 else f"placed by the {quantile:g} quantile"


def _num(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, (int, float)) else "unknown"
