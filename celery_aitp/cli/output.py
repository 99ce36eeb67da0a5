"""Shared console helpers for the command line (one place for tables and errors)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.table import Table

from celery_aitp.redact import redact

console = Console()


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Print a table; numbers are right-aligned, floats shortened. A cell too wide for
    the terminal (80 columns when piped) wraps, never cut: two task names cut to the same
    prefix could not be told apart."""
    out = Table(title=title)
    for name in columns:
        out.add_column(name, overflow="fold")
    for row in rows:
        out.add_row(*(_cell(v) for v in row))
    console.print(out)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return "" if value is None else str(value)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def fail(message: str, code: int = 2) -> NoReturn:
    """Print an error to stderr and exit non-zero."""
    click.echo(f"error: {redact(message)}", err=True)
    raise SystemExit(code)
