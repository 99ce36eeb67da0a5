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

#: Sub-command modules; each defines ``command``.
COMMANDS = ("celery_aitp.demo.command",)

for _module in COMMANDS:
    main.add_command(importlib.import_module(_module).command)
