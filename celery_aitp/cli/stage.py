"""``celery aitp stage [coexistence|split|takeover]``: show or switch the live stage.

    celery -A proj aitp stage split --percent 30 --select tenant=acme --select task='billing.*'
    celery -A proj aitp stage takeover --reason "arms equal for a week"
    celery -A proj aitp stage coexistence          # rollback: drains tier queues

Every producer and worker follows within ``refresh_interval_s``; the change is kept in
the audit log (``celery aitp history``).
"""

from __future__ import annotations

from typing import Any

import click
from pydantic import ValidationError

from celery_aitp.cli.celery_command import middleware_of
from celery_aitp.cli.output import console, emit_json, fail
from celery_aitp.errors import AitpError, StageConflict
from celery_aitp.migration.control import StageControl, who_am_i
from celery_aitp.migration.describe import describe, describe_doc
from celery_aitp.policy import SplitSettings, Stage

#: Reads and compare-and-set writes a change tries while others land in between.
CHANGE_ATTEMPTS = 5

#: ``--select`` keys and the SplitSettings field each sets.
SELECTORS = {"tenant": "tenants", "task": "tasks", "tier": "tiers",
             "max_uncertainty": "max_uncertainty"}


def parse_selectors(values: tuple[str, ...]) -> dict[str, Any]:
    """``("tenant=acme,globex", "max_uncertainty=1.5")`` -> SplitSettings fields.

    ``all`` clears every selector (route a percentage of all tasks).
    """
    fields: dict[str, Any] = {"tenants": (), "tasks": (), "tiers": (), "max_uncertainty": None}
    for item in values:
        if item.strip() == "all":
            continue
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or key not in SELECTORS or not raw.strip():
            raise click.BadParameter(
                f"{item!r}: expected KEY=VALUE with KEY one of {', '.join(SELECTORS)} "
                "(or 'all' to clear the selectors)", param_hint="--select")
        if key == "max_uncertainty":
            fields["max_uncertainty"] = raw.strip()
        else:
            name = SELECTORS[key]
            fields[name] = (*fields[name], *(v.strip() for v in raw.split(",") if v.strip()))
    return fields


def new_split(current: SplitSettings, percent: float | None,
              select: tuple[str, ...]) -> SplitSettings:
    """The current split with the given percentage and (if any given) selectors."""
    values = current.model_dump()
    if percent is not None:
        values["percent"] = percent
    if select:
        values.update(parse_selectors(select))
    try:
        return SplitSettings.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise click.BadParameter(problems) from None


@click.command("stage")
@click.argument("stage", required=False, type=click.Choice([s.value for s in Stage]))
@click.option("--percent", type=float, default=None,
              help="Split: share of the selected tasks routed (0-100; default: keep).")
@click.option("--select", multiple=True, metavar="KEY=VALUES",
              help="Split selector: tenant=a,b  task=GLOB  tier=hi  max_uncertainty=1.5 "
                   "(repeat; replaces the current selectors; 'all' clears them).")
@click.option("--reason", default=None, help="Why, for the audit log.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def command(ctx: click.Context, stage: str | None, percent: float | None,
            select: tuple[str, ...], reason: str | None, as_json: bool) -> None:
    """Show the live stage, or switch it (coexistence drains the tier queues)."""
    control = StageControl(middleware_of(ctx))
    try:
        for _ in range(CHANGE_ATTEMPTS):
            current_stage, current_split, doc = control.read()
            if stage is None:
                if percent is not None or select:
                    raise click.UsageError("--percent/--select need a stage (e.g. 'split')")
                _show(current_stage, current_split, as_json)
                return
            split = new_split(current_split, percent, select)
            try:  # written only over what was read: two operators' edits both land
                change = control.change(Stage(stage), split, who_am_i("cli"), reason,
                                        expect=doc)
                break
            except StageConflict:
                continue  # another change landed in between: apply this one on top of it
        else:
            raise AitpError("the stage kept changing under this command; try again")
    except AitpError as exc:
        fail(str(exc))
    if as_json:
        emit_json({"old": change.old, "new": change.new, "moved": change.moved})
        return
    console.print(f"stage: [bold]{describe(Stage(stage), split)}[/bold] "
                  f"(was {describe_doc(doc)})", soft_wrap=True)
    if Stage(stage) is Stage.SPLIT and split.percent == 0:
        console.print("note: the percentage is 0, so nothing is routed yet")
    if Stage(stage) is Stage.COEXISTENCE:
        console.print(f"moved {change.moved_total} waiting message(s) from tier queues to "
                      f"{control.middleware.default_queue}", soft_wrap=True)


def _show(stage: Stage, split: SplitSettings, as_json: bool) -> None:
    if as_json:
        emit_json({"stage": stage.value, "split": split.model_dump(mode="json")})
    else:
        console.print(f"stage: [bold]{describe(stage, split)}[/bold]")
