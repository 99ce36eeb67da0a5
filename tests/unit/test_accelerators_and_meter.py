"""Per-run measures (peak memory, accelerator use) and the accelerator probes."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
from celery_aitp_adapters.accelerators import NvidiaSmiProbe, NvmlProbe, auto_probe

from celery_aitp.errors import AdapterError
from celery_aitp.stubs import FixedAccelerator, NoAccelerators
from celery_aitp.worker.meter import RunMeter, make_probe, peak_rss_mb, reset_peak_rss

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="VmHWM reset is Linux-only")


RUNS = """
import json, sys
from celery_aitp.worker.meter import RunMeter
meter = RunMeter(per_run_memory=sys.argv[1] == "on")
meter.start("big")
block = bytearray(200 * 1024 * 1024)
block[::4096] = b"x" * len(block[::4096])
big = meter.stop("big")
del block
meter.start("small")
print(json.dumps([big, meter.stop("small")]))
"""


def runs(mode: str) -> list[dict]:
    """A big run then a small one, in a fresh interpreter (no history of this process)."""
    import json

    out = subprocess.run([sys.executable, "-c", RUNS, mode], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)


@linux_only
def test_per_run_peak_resets_between_runs_where_the_lifetime_peak_would_not():
    big, small = runs("on")
    assert big["memory_scope"] == small["memory_scope"] == "run"
    assert big["run_peak_rss_mb"] > 200
    assert small["run_peak_rss_mb"] < big["run_peak_rss_mb"] - 150  # the reset worked
    big, small = runs("off")
    assert small["memory_scope"] == "process"
    assert small["run_peak_rss_mb"] > 200  # the lifetime peak: the small run looks big


def test_overlapping_runs_in_one_process_are_marked_shared():
    meter = RunMeter(FixedAccelerator("gpu"))
    meter.start("a")
    meter.start("b")
    a = meter.stop("a")
    b = meter.stop("b")
    assert a["memory_scope"] == b["memory_scope"] == "shared"
    assert a["used_accelerator"] is None  # shared runs: accelerator use is not attributed
    meter.start("c")
    c = meter.stop("c")
    assert c["memory_scope"] in ("run", "process") and c["used_accelerator"] == "gpu"


def test_without_per_run_memory_the_scope_is_process():
    meter = RunMeter(per_run_memory=False)
    meter.start("a")
    assert meter.stop("a")["memory_scope"] == "process"


def test_a_failing_probe_never_fails_the_run():
    class Broken:
        def usage(self, pid, since):
            raise RuntimeError("driver gone")

    meter = RunMeter(Broken())
    meter.start("a")
    assert meter.stop("a")["used_accelerator"] is None


@linux_only
def test_peak_rss_reads_vmhwm():
    assert reset_peak_rss() is True
    assert peak_rss_mb() > 1


class FakeNvml:
    """The parts of pynvml the probe uses."""

    NVML_ERROR_NOT_FOUND = 6

    class NVMLError(Exception):
        def __init__(self, value):
            self.value = value

    def __init__(self, procs, samples, count=1, fail_init=False, sample_error=None):
        self.procs, self.samples, self.count = procs, samples, count
        self.fail_init, self.sample_error = fail_init, sample_error

    def nvmlInit(self):  # noqa: N802
        if self.fail_init:
            raise self.NVMLError(9)

    def nvmlDeviceGetCount(self):  # noqa: N802
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        return f"gpu{i}"

    def nvmlDeviceGetComputeRunningProcesses(self, handle):  # noqa: N802
        return self.procs

    def nvmlDeviceGetProcessUtilization(self, handle, since_us):  # noqa: N802
        if self.sample_error is not None:
            raise self.NVMLError(self.sample_error)
        return [s for s in self.samples if s.timeStamp >= since_us]


def proc(pid, mb):
    return SimpleNamespace(pid=pid, usedGpuMemory=int(mb * 1024 * 1024))


def sample(pid, at_s, util):
    return SimpleNamespace(pid=pid, timeStamp=int(at_s * 1e6), smUtil=util)


def test_nvml_counts_sm_samples_of_this_run_only():
    nvml = FakeNvml([proc(42, 500)], [sample(42, 99.0, 80), sample(42, 101.0, 0),
                                       sample(7, 101.0, 90)])
    probe = NvmlProbe(nvml=nvml)
    assert probe.classes() == ["gpu"]
    busy_before = probe.usage(42, since=100.0)  # the 80% sample was an earlier task
    assert busy_before.accelerator is None and busy_before.memory_mb == pytest.approx(500)
    nvml.samples.append(sample(42, 102.0, 35))
    used = probe.usage(42, since=100.0)
    assert used.accelerator == "gpu" and used.utilisation == 35


def test_nvml_without_sampling_falls_back_to_memory_held():
    probe = NvmlProbe(nvml=FakeNvml([proc(42, 100)], [], sample_error=3))  # NOT_SUPPORTED
    assert probe.usage(42, 0.0).accelerator == "gpu"
    assert probe.usage(43, 0.0).accelerator is None
    no_samples = NvmlProbe(nvml=FakeNvml([proc(42, 100)], [], sample_error=6))  # NOT_FOUND
    assert no_samples.usage(42, 0.0).accelerator is None  # sampled: idle during the run


def test_nvml_init_failure_is_an_adapter_error():
    with pytest.raises(AdapterError, match="NVML unavailable"):
        NvmlProbe(nvml=FakeNvml([], [], fail_init=True))


def test_the_real_nvml_library_without_a_driver_is_refused_clearly():
    pytest.importorskip("pynvml")  # the nvml extra; this machine has no NVIDIA driver
    with pytest.raises(AdapterError):
        NvmlProbe()


def test_nvidia_smi_parses_per_process_memory():
    outputs = {"--query-gpu=name": "NVIDIA A100\n",
               "--query-compute-apps=pid,used_memory": "42, 812\n7, 100\n"}

    def run(cmd):
        return outputs[cmd[1]]

    probe = NvidiaSmiProbe(run=run)
    assert probe.classes() == ["gpu"]
    assert probe.usage(42, 0.0).memory_mb == 812 and probe.usage(42, 0.0).accelerator == "gpu"
    assert probe.usage(99, 0.0).accelerator is None


def test_nvidia_smi_failures_mean_cannot_tell():
    def run(cmd):
        if cmd[1].startswith("--query-gpu"):
            return "GPU\n"
        raise subprocess.TimeoutExpired(cmd, 2)

    assert NvidiaSmiProbe(run=run).usage(1, 0.0) is None
    with pytest.raises(AdapterError):
        NvidiaSmiProbe(run=lambda cmd: (_ for _ in ()).throw(FileNotFoundError("nvidia-smi")))


def test_auto_probe_on_this_cpu_only_machine_is_the_null_probe():
    probe = auto_probe()
    assert isinstance(probe, NoAccelerators)
    assert probe.classes() == [] and probe.usage(1, 0.0) is None
    assert isinstance(make_probe("auto"), NoAccelerators)
    assert isinstance(make_probe("nvml"), NoAccelerators)  # unavailable: warned, not raised
    assert isinstance(make_probe("no-such-probe"), NoAccelerators)
    fixed = make_probe("celery_aitp.stubs:FixedAccelerator")
    assert fixed.usage(1, 0.0).accelerator == "gpu"
