"""``celery aitp guard [--dry-run]``: step the split up while the routed arm passes.

Configured by the policy's ``guard`` section; runs in the foreground until it promotes,
completes, rolls back or is stopped (Ctrl-C or SIGTERM leave the stage as it is). With
``guard.watch_takeover`` (the default) a promotion does not end it: it keeps analysing
takeover and steps back to split when takeover fails; started in takeover, it watches.
Exit status: 0 promoted or completed, 1 rolled back (or would have, in a dry run),
3 stopped, 2 could not start.
"""

from __future__ import annotations

import signal
import threading
import time

import click

from celery_aitp.cli.celery_command import middleware_of
from celery_aitp.cli.output import console, fail
from celery_aitp.errors import AitpError
from celery_aitp.migration.guard import ROLLED_BACK, STOPPED, Guard

EXIT = {ROLLED_BACK: 1, STOPPED: 3}


def _say(text: str) -> None:
    console.print(f"{time.strftime('%H:%M:%S')} {text}", soft_wrap=True, highlight=False)


@click.command("guard")
@click.option("--dry-run", is_flag=True, default=None,
              help="Change nothing; report what the guard would do.")
@click.pass_context
def command(ctx: click.Context, dry_run: bool | None) -> None:
    """Promote the split step by step while the routed arm passes; roll back if not."""
    mw = middleware_of(ctx)
    guard = Guard(mw, dry_run=dry_run or None, say=_say)
    settings = guard.settings
    _say(f"guard: steps {', '.join(f'{s:g}%' for s in settings.steps)}, every "
         f"{settings.interval_s:g} s, rollback after {settings.failure_limit} failed "
         f"analyses" + ("; then watching takeover" if settings.watch_takeover else "")
         + (" [dry run]" if guard.dry_run else ""))
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        state = guard.run(stop)
    except KeyboardInterrupt:
        state = STOPPED
    except AitpError as exc:
        fail(str(exc))
    finally:
        signal.signal(signal.SIGTERM, previous)
    raise SystemExit(EXIT.get(state, 0))
