"""Tasks of the example: plain Celery tasks with a celery_aitp declaration."""

from celery import shared_task


@shared_task(aitp={"tier": "mid", "runtime_hint_s": 2.0})
def build_report(rows: int) -> int:
    """A report of ``rows`` rows; the tenant comes from the request that asked for it."""
    return rows
