"""Per-run resource measures in the pool process: peak memory and accelerator use.

``ru_maxrss`` is the peak of the whole process lifetime, so after one big task every
later task of that pool process would look big. On Linux (4.0+), writing ``5`` to
``/proc/self/clear_refs`` resets the peak (``VmHWM`` in ``/proc/self/status``) to the
current RSS; the meter does that when a run starts and reads ``VmHWM`` when it ends.
The reset also resets what ``getrusage`` reports as ``ru_maxrss`` for the process, so
the observation's ``peak_rss_mb`` becomes a per-run figure too where the meter runs.

Limits (recorded in each observation as ``memory_scope``):

* ``run``: the peak RSS of the process during this run. It includes what the process
  already held (interpreter, imports, caches): it is the memory a worker needs to run
  the task, not the task's own allocations.
* ``shared``: another task ran in the same process at the same time (threads, gevent,
  eventlet pools), so the peak belongs to several runs; profiles ignore it.
* ``process``: no per-run measure here (not Linux, ``/proc`` read-only, or turned off
  with ``aitp_per_run_memory = False``); ``run_peak_rss_mb`` is then the lifetime peak
  and profiles ignore it.

Peaks shorter than the kernel's RSS accounting granularity can be missed, and memory
mapped but never touched does not count (it is resident set size).
"""

from __future__ import annotations

import logging
import os
import resource
import time
from typing import Any

logger = logging.getLogger(__name__)


def make_probe(name: Any) -> Any:
    """The accelerator probe for a setting (alias, 'module:attr' or object); never raises."""
    from celery_aitp.registry import ACCELERATOR_PROBES, resolve
    from celery_aitp.stubs import NoAccelerators

    try:
        found = resolve(ACCELERATOR_PROBES, name)
        probe = found() if callable(found) else found
    except Exception as exc:  # a missing driver must not stop the worker
        logger.warning("aitp: accelerator probe %r unavailable, using none: %s", name, exc)
        return NoAccelerators()
    logger.debug("aitp: accelerator probe %s, classes %s", type(probe).__name__,
                 probe.classes())
    return probe

_CLEAR_REFS = "/proc/self/clear_refs"
_STATUS = "/proc/self/status"


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS to its current RSS; False if the OS cannot."""
    try:
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float | None:
    """``VmHWM`` of this process in MB (since start or the last reset); None if unknown."""
    try:
        with open(_STATUS, "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) / 1024.0  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def lifetime_peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


class RunMeter:
    """Start/stop measures around each run of one pool process."""

    def __init__(self, probe: Any = None, per_run_memory: bool = True) -> None:
        self.probe = probe
        self.per_run_memory = per_run_memory
        self._runs: dict[str, tuple[float, bool]] = {}  # task id -> (start, per-run peak ok)
        self._overlapped: set[str] = set()

    def start(self, task_id: str) -> None:
        if self._runs:  # another run is in flight in this process: peaks are shared
            self._overlapped.update(self._runs)
            self._overlapped.add(task_id)
            self._runs[task_id] = (time.time(), False)
            return
        ok = self.per_run_memory and reset_peak_rss()
        self._runs[task_id] = (time.time(), ok)

    def stop(self, task_id: str) -> dict[str, Any]:
        """The measures of a finished run, as observation-record fields."""
        started, per_run = self._runs.pop(task_id, (None, False))
        shared = task_id in self._overlapped
        self._overlapped.discard(task_id)
        peak = peak_rss_mb() if per_run else None
        if shared:
            scope = "shared"
        elif per_run and peak is not None:
            scope = "run"
        else:
            scope = "process"
        fields: dict[str, Any] = {
            "run_peak_rss_mb": round(peak if peak is not None else lifetime_peak_rss_mb(), 3),
            "memory_scope": scope,
            "used_accelerator": None,
            "accelerator_mem_mb": None,
            "accelerator_util": None,
        }
        if self.probe is not None and started is not None and not shared:
            fields.update(self._accelerator(started))
        return fields

    def _accelerator(self, started: float) -> dict[str, Any]:
        try:
            usage = self.probe.usage(os.getpid(), started) if self.probe else None
        except Exception:  # a probe must never fail a task
            logger.debug("aitp: accelerator probe failed", exc_info=True)
            return {}
        if usage is None:
            return {}
        return {
            "used_accelerator": usage.accelerator or "none",
            "accelerator_mem_mb": usage.memory_mb,
            "accelerator_util": usage.utilisation,
        }
