"""Accelerator probes: which GPUs a host has and whether a run used one.

* :class:`NvmlProbe` reads NVIDIA's management library (``nvidia-ml-py``, the ``nvml``
  extra). Per run it asks for the process's SM-utilisation samples taken since the run
  started (``nvmlDeviceGetProcessUtilization``), so a pool process that merely keeps a
  CUDA context from an earlier task does not count as using the GPU; it also reports the
  GPU memory the process holds at the end. Where the driver cannot sample utilisation,
  holding GPU memory counts as use.
* :class:`NvidiaSmiProbe` runs ``nvidia-smi`` when the library is missing. It sees only
  the memory a process holds when the run ends (a process that keeps a CUDA context
  looks busy for every later task) and costs a subprocess (tens of ms) per run.
* :func:`auto_probe` picks NVML, else ``nvidia-smi``, else
  :class:`celery_aitp.stubs.NoAccelerators`.

A probe never raises from ``usage``: a driver error means "cannot tell" (None).
"""

from __future__ import annotations

import importlib
import logging
import shutil
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

from celery_aitp.errors import AdapterError
from celery_aitp.ports import AcceleratorUsage
from celery_aitp.stubs import NoAccelerators

logger = logging.getLogger(__name__)

_MB = 1024.0 * 1024.0


class NvmlProbe:
    """NVIDIA GPUs through NVML; ``nvml`` is the ``pynvml`` module (injectable for tests)."""

    def __init__(self, accelerator_class: str = "gpu", nvml: Any = None) -> None:
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError as exc:
                raise AdapterError("NVML probe needs nvidia-ml-py: "
                                   "pip install 'celery-aitp[nvml]'") from exc
        self.nvml = nvml
        self.accelerator_class = accelerator_class
        try:
            nvml.nvmlInit()
            self.handles = [nvml.nvmlDeviceGetHandleByIndex(i)
                            for i in range(nvml.nvmlDeviceGetCount())]
        except nvml.NVMLError as exc:
            raise AdapterError(f"NVML unavailable: {exc}") from exc

    def classes(self) -> list[str]:
        return [self.accelerator_class] if self.handles else []

    def _held_mb(self, handle: Any, pid: int) -> float | None:
        held = None
        for proc in self.nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == pid:
                used = proc.usedGpuMemory
                held = (held or 0.0) + (used / _MB if used else 0.0)
        return held

    def _utilisation(self, handle: Any, pid: int, since_us: int) -> float | None:
        """Highest SM utilisation of ``pid`` since ``since_us``; 0 if no sample; None if
        the driver cannot sample utilisation."""
        nvml = self.nvml
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(handle, since_us)
        except nvml.NVMLError as exc:
            not_found = getattr(nvml, "NVML_ERROR_NOT_FOUND", 6)
            return 0.0 if getattr(exc, "value", None) in (not_found, 0) else None
        seen = [s.smUtil for s in samples if s.pid == pid and s.timeStamp >= since_us]
        return float(max(seen)) if seen else 0.0

    def usage(self, pid: int, since: float) -> AcceleratorUsage | None:
        if not self.handles:
            return None
        since_us = int(since * 1e6)
        memory: float | None = None
        utilisation: float | None = None
        sampled = False
        try:
            for handle in self.handles:
                held = self._held_mb(handle, pid)
                if held is not None:
                    memory = (memory or 0.0) + held
                util = self._utilisation(handle, pid, since_us)
                if util is not None:
                    sampled = True
                    utilisation = max(utilisation or 0.0, util)
        except self.nvml.NVMLError as exc:
            logger.debug("aitp: NVML usage query failed: %s", exc)
            return None
        used = bool(utilisation) if sampled else bool(memory)
        return AcceleratorUsage(self.accelerator_class if used else None, memory, utilisation)


Runner = Callable[[Sequence[str]], str]


def _run(cmd: Sequence[str]) -> str:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=2.0,
                          check=True).stdout


class NvidiaSmiProbe:
    """NVIDIA GPUs through the ``nvidia-smi`` command; ``run`` is injectable for tests."""

    def __init__(self, accelerator_class: str = "gpu", run: Runner | None = None,
                 binary: str = "nvidia-smi") -> None:
        self.accelerator_class = accelerator_class
        self.binary = binary
        self.run = run or _run
        try:
            names = self.run([binary, "--query-gpu=name", "--format=csv,noheader"])
        except (OSError, subprocess.SubprocessError) as exc:
            raise AdapterError(f"{binary} unavailable: {exc}") from exc
        self.gpus = [line.strip() for line in names.splitlines() if line.strip()]

    def classes(self) -> list[str]:
        return [self.accelerator_class] if self.gpus else []

    def usage(self, pid: int, since: float) -> AcceleratorUsage | None:
        if not self.gpus:
            return None
        try:
            out = self.run([self.binary, "--query-compute-apps=pid,used_memory",
                            "--format=csv,noheader,nounits"])
        except (OSError, subprocess.SubprocessError) as exc:
            logger.debug("aitp: nvidia-smi failed: %s", exc)
            return None
        held = 0.0
        for line in out.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) >= 2 and parts[0] == str(pid):
                try:
                    held += float(parts[1])
                except ValueError:
                    continue
        return AcceleratorUsage(self.accelerator_class if held > 0 else None,
                                held if held > 0 else None)


def auto_probe() -> Any:
    """NVML if it works, else ``nvidia-smi`` if it is on the PATH, else no accelerators."""
    try:
        return NvmlProbe()
    except AdapterError as exc:
        logger.debug("aitp: %s", exc)
    if shutil.which("nvidia-smi"):
        try:
            return NvidiaSmiProbe()
        except AdapterError as exc:
            logger.debug("aitp: %s", exc)
    return NoAccelerators()
