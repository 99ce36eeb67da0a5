"""A pretend GPU for integration tests on a machine without one.

A task calls :func:`use` while it runs; :class:`FakeGpuProbe` (set with
``AITP_ACCELERATOR_PROBE=tests.support.fake_gpu:FakeGpuProbe``) then reports that run
as having used the ``gpu`` class, and every other run as having used none, the way the
NVML probe reports a host that has a GPU.
"""

from __future__ import annotations

from celery_aitp.ports import AcceleratorUsage

_used = False


def use() -> None:
    global _used
    _used = True


class FakeGpuProbe:
    def classes(self) -> list[str]:
        return ["gpu"]

    def usage(self, pid: int, since: float) -> AcceleratorUsage | None:
        global _used
        used, _used = _used, False
        return AcceleratorUsage("gpu" if used else None, 512.0 if used else None,
                                90.0 if used else 0.0)
