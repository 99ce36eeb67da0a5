"""``celery -A proj aitp ...``: operate the middleware of an app.

Each sub-command lives in its own module and is registered in ``COMMANDS`` below.
"""

from __future__ import annotations

from typing import Any

import click

from celery_aitp.cli.common import validate
from celery_aitp.cli.output import fail


def middleware_of(ctx: click.Context, follow_applied: bool = True) -> Any:
    """The app's middleware, or a clear error if ``install(app)`` was never called.

    It decides by the policy applied to the fleet (``celery aitp policy apply``), as
    workers do from their start: a command run with the app's own file would otherwise
    not know a tenant added live (``stage split --select tenant=...`` refused it, and a
    rollback to coexistence left its tier queues to the janitor). A store that does not
    answer, or an applied policy with other tiers, leaves the app's own. ``policy``
    passes ``follow_applied=False``: it shows this app's policy beside the applied one.
    """
    app = ctx.obj.app
    mw = getattr(app, "aitp", None)
    if mw is None:
        fail(f"app {app.main!r} has no AITP middleware: call celery_aitp.install(app) in it")
    if follow_applied:
        mw.adopt_active_policy()
    return mw


@click.group("aitp")
@click.pass_context
def aitp(ctx: click.Context) -> None:
    """Intelligent task placement: status, stages, evacuation, models, dashboard."""


aitp.add_command(validate)

#: Sub-command modules; each defines ``command`` (a click command using ``middleware_of``).
COMMANDS = (
    "celery_aitp.cli.status",
    "celery_aitp.cli.evacuate",
    "celery_aitp.cli.age",
    "celery_aitp.cli.replay",
    "celery_aitp.cli.train",
    "celery_aitp.cli.trainer",
    "celery_aitp.cli.model",
    "celery_aitp.cli.stage",
    "celery_aitp.cli.history",
    "celery_aitp.cli.placement",
    "celery_aitp.cli.report",
    "celery_aitp.cli.guard",
    "celery_aitp.cli.explain",
    "celery_aitp.cli.policy",
    "celery_aitp.cli.dashboard",
)


def _register() -> None:
    import importlib

    for module in COMMANDS:
        aitp.add_command(importlib.import_module(module).command)


_register()
