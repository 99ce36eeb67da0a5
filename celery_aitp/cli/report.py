"""``celery aitp report``: what shadow (and split) observed, and what routing would change.

Reads the observation records workers wrote (``worker/observe.py``) and prints:
prediction error by task and by tenant, how often and where the route would differ,
the modelled wait per tier (``migration/waitmodel.py``) and, once split ran, the arms
side by side.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

import click

from celery_aitp.cli.celery_command import middleware_of
from celery_aitp.cli.output import console, emit_json, fail, table
from celery_aitp.core.view import stage_from_doc
from celery_aitp.errors import AitpError
from celery_aitp.migration.analysis import (
    ArmStats,
    ErrorStats,
    arm_stats,
    prediction_error,
    route_differences,
)
from celery_aitp.migration.records import latest_records, records_since
from celery_aitp.migration.waitmodel import model_waits
from celery_aitp.publish.split import SplitRule

ERROR_COLUMNS = ["runs", "actual s", "predicted s", "MAE s", "median rel err", "bias s",
                 "within p90"]


def _error_rows(groups: dict[str, ErrorStats]) -> list[list[Any]]:
    return [[name, s.n, s.mean_actual_s, s.mean_predicted_s, s.mae_s,
             f"{s.median_rel_error:.0%}", s.bias_s,
             "" if s.p90_coverage is None else f"{s.p90_coverage:.0%}"]
            for name, s in groups.items()]


def _pct(value: float | None) -> str:
    return "" if value is None else f"{value:.1%}"


def _arm_row(name: str, arm: ArmStats) -> list[Any]:
    return [name, arm.n, arm.wait(0.5), arm.wait(0.9), _pct(arm.sla_hit_rate),
            _pct(arm.failure_rate), _pct(arm.fallback_rate) if name == "routed" else ""]


def _arm_json(arm: ArmStats) -> dict[str, Any]:
    return {"runs": arm.n, "wait_p50_s": arm.wait(0.5), "wait_p90_s": arm.wait(0.9),
            "sla_hit_rate": arm.sla_hit_rate, "failure_rate": arm.failure_rate,
            "fallback_rate": arm.fallback_rate, "prediction_error": arm.prediction_error,
            "clock_skew": arm.clock_skew}


@click.command("report")
@click.option("--last", "last", type=click.IntRange(1, 1_000_000), default=20_000,
              show_default=True, help="Use the newest N observed runs.")
@click.option("--since", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Use the runs recorded in the last SECONDS instead.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def command(ctx: click.Context, last: int, since: float | None, as_json: bool) -> None:
    """Prediction error, where routing would differ, modelled and measured waits."""
    mw = middleware_of(ctx)
    stream = mw.store.keys.observations
    try:
        if since is not None:
            records, _ = records_since(mw.store, stream, since=time.time() - since)
        else:
            records = latest_records(mw.store, stream, last)
        _, split = stage_from_doc(mw.store.read_stage(), mw.policy)
    except AitpError as exc:
        fail(str(exc))
    by_task = prediction_error(records, lambda r: r.get("task"))
    by_tenant = prediction_error(records, lambda r: r.get("tenant"))
    routes = route_differences(records)
    model = model_waits(records, mw.policy.tier_names)
    arms = arm_stats(records, mw.policy, SplitRule(split))
    if as_json:
        emit_json({
            "runs": len(records),
            "prediction_error": {"by_task": {k: asdict(v) for k, v in by_task.items()},
                                 "by_tenant": {k: asdict(v) for k, v in by_tenant.items()}},
            "routes": {"standard": routes.standard, "differ": routes.differ,
                       "pairs": [{"ran_on": a, "would_go_to": b, "runs": n}
                                 for (a, b), n in routes.pairs.most_common()]},
            "wait_model": asdict(model) if model else None,
            "arms": {name: _arm_json(arm) for name, arm in arms.items()},
        })
        return
    _print(len(records), by_task, by_tenant, routes, model, arms)


def _print(n: int, by_task: dict[str, ErrorStats], by_tenant: dict[str, ErrorStats],
           routes: Any, model: Any, arms: dict[str, ArmStats]) -> None:
    console.print(f"{n} observed run(s)")
    if by_task:
        table("prediction error by task", ["task", *ERROR_COLUMNS], _error_rows(by_task))
        table("prediction error by tenant", ["tenant", *ERROR_COLUMNS], _error_rows(by_tenant))
    else:
        console.print("prediction error: no run carried a prediction yet")
    if routes.standard:
        console.print(f"route: {routes.differ} of {routes.standard} run(s) on Celery's route "
                      f"({_pct(routes.share)}) would have gone to a tier queue", soft_wrap=True)
        table("where the route would differ", ["ran on", "would go to", "runs"],
              [(a, b, k) for (a, b), k in routes.pairs.most_common(20)])
    if model is not None:
        console.print(f"wait model: {model.n} run(s) over {model.window_s:.0f} s, mean wait "
                      f"{model.observed_wait_s:.3g} s, utilisation {model.utilisation:.0%} "
                      f"(pooled M/G/1, tiers served first; see docs/migration.md)", soft_wrap=True)
        table("modelled wait by tier", ["tier", "runs", "per s", "service s", "observed s",
                                        "modelled s", "difference s"],
              [(c.name, c.n, c.rate_per_s, c.mean_service_s, c.observed_wait_s,
                c.modelled_wait_s, c.difference_s) for c in model.classes])
    if arms["routed"].n or arms["standard"].n:
        table("arms (split)", ["arm", "runs", "wait p50 s", "wait p90 s", "SLA hit",
                               "failed", "fell back"],
              [_arm_row(name, arm) for name, arm in arms.items()])
