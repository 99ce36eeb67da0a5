"""What the benchmark apps' workers and their drivers agree on (no Celery app here, so
importing it builds none): the app modes, the header carrying a task's true runtime, and
the Redis list each finished task appends its timing record to."""

from __future__ import annotations

MODES = ("fifo", "aitp", "oracle")
RUNTIME_HEADER = "bench_runtime_s"
#: Header of a run whose tasks share this many emulated cores (see ``placement_app.work``).
CORES_HEADER = "bench_cores"


def results_key(queue: str) -> str:
    """Redis list where each finished task appends its timing record."""
    return f"{queue}:runs"


def running_key(queue: str) -> str:
    """Redis counter of the tasks running now, over every worker of the run."""
    return f"{queue}:running"
