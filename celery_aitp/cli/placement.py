"""``celery aitp placement``: the tier boundaries, what a read of each tier is charged,
the boosts in force and their changes, and which tier queues spill to standard workers
now."""

from __future__ import annotations

from typing import Any

import click

from celery_aitp.cli.celery_command import middleware_of
from celery_aitp.cli.output import console, emit_json, fail, table
from celery_aitp.errors import AitpError
from celery_aitp.explain import tier_ranges
from celery_aitp.migration.describe import when
from celery_aitp.scheduling.feedback import boost_history, read_boosts
from celery_aitp.scheduling.size_classes import SizeClasses
from celery_aitp.scheduling.size_source import classes_for, read_sizes
from celery_aitp.scheduling.spill import read_capacity
from celery_aitp.scheduling.usage import read_usage, tier_charges


@click.command("placement")
@click.option("--limit", type=click.IntRange(1, 1000), default=10, show_default=True,
              help="How many boost changes to show.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def command(ctx: click.Context, limit: int, as_json: bool) -> None:
    """Size-class boundaries per accelerator class, boosts and their audit log."""
    mw = middleware_of(ctx)
    policy = mw.policy
    try:
        sizes = read_sizes(mw.store)
        boosts = read_boosts(mw.store, policy).by_tenant
        history = boost_history(mw.store, limit)
        capacity = read_capacity(mw.store, policy.spill) if policy.spill.enabled else None
        tier_runtime = read_usage(mw.store, policy).tier_runtime
    except AitpError as exc:
        fail(str(exc))
    tiers = policy.tier_names
    # the boundaries producers would draw now (fresh: no earlier ones to keep)
    bounds = classes_for(sizes, SizeClasses(), len(tiers), policy.placement).bounds
    classes: dict[str, dict[str, Any]] = {
        accelerator: {"recent_sizes": round(hist.total, 1),
                      "bounds_s": list(bounds[accelerator]) if accelerator in bounds
                      else None}
        for accelerator, hist in sizes.items()}
    charges = tier_charges(tier_runtime)
    reads = [(key, round(mean, 3), round(charges[key], 2))
             for key, mean in sorted(tier_runtime.items()) if key in charges]
    if as_json:
        emit_json({"tiers": list(tiers), "classes": classes, "boosts": boosts,
                   "read_charges": {key: {"mean_run_s": mean, "charge": charge}
                                    for key, mean, charge in reads},
                   "history": history,
                   "spill": capacity.as_dict() if capacity is not None else None})
        return
    rows = []
    for accelerator, found in sorted(classes.items()):
        bounds = found["bounds_s"]
        text = "too few recent sizes: every task takes the lowest tier" if bounds is None \
            else "; ".join(tier_ranges(tiers, bounds))
        rows.append((accelerator, found["recent_sizes"], text))
    table("size classes (effective size: predicted size over urgency and boost)",
          ["accelerator", "recent sizes", "tiers"], rows)
    if reads:  # worker/tier_cycle.py: weights share the worker's time, not its reads
        table("read charges (weighted tier order)", ["tier", "mean run s", "charge"], reads)
    else:
        console.print("read charges: no run measured yet (every read counts 1)")
    if boosts:
        table("boosts in force", ["tenant", "boost"], sorted(boosts.items()))
    else:
        console.print("no tenant is boosted")
    if capacity is None:
        console.print("spill: off (policy)")
    elif not capacity.backlog:
        console.print("spill: no tier queue is saturated")
    else:
        console.print(
            f"spill: spilling to idle {capacity.spill_class} standard workers "
            f"({capacity.idle_slots} slots)" if capacity.spill_class else
            "spill: saturated, but no idle standard workers of one class: nothing spills")
        table("saturated tier queues", ["queue", "waiting per slot"],
              sorted(capacity.backlog.items()))
    table("boost changes (newest first)", ["time", "tenant", "old", "new", "why"],
          [(when(e.get("at")), e.get("tenant"), e.get("old"), e.get("new"), e.get("why"))
           for e in history])
