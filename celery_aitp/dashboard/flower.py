"""Links to a running Flower (``--flower-url``), for what Flower shows and we do not.

Flower has a page per worker (``/worker/<name>``) and per task (``/task/<id>``); the
dashboard's worker rows and task page link there, so an operator moves from "why was it
routed here" to "what is that worker doing" in one click.
"""

from __future__ import annotations

from urllib.parse import quote


def flower_link(base: str, kind: str, name: object) -> str | None:
    """Flower's page of a worker or a task; None without a base URL or a name."""
    if not base or not isinstance(name, str) or not name:
        return None
    return f"{base}/{kind}/{quote(name, safe='@')}"
