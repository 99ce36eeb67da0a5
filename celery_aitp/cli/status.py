"""``celery aitp status``: stage, live workers and queue depths at a glance.

Workers are those that advertised within the last hour (the store prunes the others);
one whose heartbeat is older than ``worker_ttl_s`` (killed, or paused) is listed after
the live ones and marked ``GONE`` (``"alive": false`` with ``--json``)."""

from __future__ import annotations

import click

from celery_aitp.cli.celery_command import middleware_of
from celery_aitp.cli.output import console, emit_json, fail, table
from celery_aitp.core.view import stage_from_doc
from celery_aitp.errors import AitpError
from celery_aitp.migration.describe import describe, when
from celery_aitp.migration.guard_state import describe_guard, read_guard_state


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.pass_context
def command(ctx: click.Context, as_json: bool) -> None:
    """Show the live stage and its last change, the guard, workers and counters."""
    mw = middleware_of(ctx)
    try:
        stage, split = stage_from_doc(mw.store.read_stage(), mw.policy)
        last = mw.store.stage_history(1)
        guard = read_guard_state(mw.store)
        now, workers = mw.store.workers_at()  # heartbeats: the store server's clock
        counts = mw.store.counts()
    except AitpError as exc:
        fail(str(exc))
    ttl = mw.settings.worker_ttl_s
    for w in workers:  # a worker killed without withdrawing stays listed for an hour
        age = now - float(w["heartbeat"])
        w["heartbeat_age_s"], w["alive"] = round(age, 3), age <= ttl
    workers.sort(key=lambda w: not w["alive"])  # the live ones first
    if as_json:
        emit_json({"stage": stage.value, "split": split.model_dump(mode="json"),
                   "last_change": last[0] if last else None, "guard": guard,
                   "workers": workers, "counters": counts})
        return
    console.print(f"stage: [bold]{describe(stage, split)}[/bold]")
    if last:
        entry = last[0]
        why = f": {entry['why']}" if entry.get("why") else ""
        console.print(f"changed {when(entry.get('at'))} by {entry.get('who')}{why}",
                      soft_wrap=True)
    else:
        console.print("changed: never recorded: the store holds no stage, so each process "
                      "decides by its own policy's stage (this one's: "
                      f"{mw.policy.stage.value}). If the store lost its data, set the stage "
                      "again with 'celery aitp stage' so every process follows one.",
                      soft_wrap=True)
    if guard:
        console.print(f"guard: {describe_guard(guard)}", soft_wrap=True)
    gone = sum(not w["alive"] for w in workers)
    table(f"workers ({len(workers) - gone} live, {gone} gone: no heartbeat for more than "
          f"worker_ttl_s {ttl:g} s)" if gone else "workers",
          ["worker", "state", "accelerator", "tenants", "tiers", "heartbeat age s"],
          [(w.get("worker"), "live" if w["alive"] else "GONE", w.get("accelerator"),
            ",".join(w.get("tenants", [])),
            ",".join(w.get("tiers", [])) + (" (express)" if w.get("express") is True else ""),
            w["heartbeat_age_s"]) for w in workers])
    table("counters", ["counter", "count"], sorted(counts.items()))
