"""``celery-aitp``: commands that need no Celery app (demo, validate, offline tools)."""

from __future__ import annotations

import importlib

import click

from celery_aitp.cli.common import validate
from celery_aitp.cli.offline import predict_command, train_command


@click.group()
@click.version_option(package_name="celery-aitp")
def main() -> None:
    """celery_aitp without an app: run the demo, validate policies, offline tools."""


main.add_command(validate)
main.add_command(train_command)
main.add_command(predict_command)

#: Sub-command modules; each defines ``command`` (or ``offline_command`` when its
#: ``command`` is the app-bound ``celery aitp`` variant).
COMMANDS = ("celery_aitp.demo.command", "celery_aitp.cli.replay", "celery_aitp.cli.import_swf")

for _module in COMMANDS:
    _loaded = importlib.import_module(_module)
    main.add_command(getattr(_loaded, "offline_command", None) or _loaded.command)
