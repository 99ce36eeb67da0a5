"""Cost of the profile and priority stages on the publish path (in-process, no I/O).

    python benchmarks/priority_stages.py [--n 200000]

Prints p50/p99 in microseconds for the two stages together, for a plain task, one with
``aitp_labels`` in its headers, one whose tenant is demoted by fair share, and one with
an observed profile; and the same for the whole default pipeline (tenant -> gate).
"""

from __future__ import annotations

import argparse
import time
from types import MappingProxyType

from celery_aitp.core.request import Decision, Request
from celery_aitp.core.view import View
from celery_aitp.policy import SplitSettings, Stage, parse_policy
from celery_aitp.profiles.profile import ObservedProfile
from celery_aitp.profiles.store import ProfileBook
from celery_aitp.publish.pipeline import Pipeline, default_stages
from celery_aitp.scheduling.usage import UsageSnapshot

POLICY = parse_policy({
    "tiers": [{"name": "hi", "sla_s": 1}, {"name": "mid", "sla_s": 10},
              {"name": "lo", "sla_s": 60}],
    "tenants": {"acme": {"max_tier": "hi", "weight": 2}, "globex": {"max_tier": "mid"},
                "default": {}},
    "labels": {"billing": 0.8, "batch": 0.1},
    "stage": "takeover",
})
LIVE = frozenset({"aitp.acme.cpu.mid", "aitp.acme.gpu.mid", "aitp.acme.cpu.lo"})


def view(demoted: frozenset[str] = frozenset(), profiles: dict | None = None) -> View:
    sources = {"profiles": ProfileBook(profiles or {}), "usage": UsageSnapshot(demoted=demoted)}
    return View(LIVE, Stage.TAKEOVER, SplitSettings(), True, sources=MappingProxyType(sources))


def measure(fn, n: int) -> tuple[float, float]:
    clock = time.perf_counter_ns
    samples = []
    for _ in range(n):
        t0 = clock()
        fn()
        samples.append(clock() - t0)
    samples.sort()
    return samples[len(samples) // 2] / 1000, samples[int(len(samples) * 0.99)] / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000)
    n = parser.parse_args().n
    stages = default_stages(POLICY)
    profile, priority = stages["profile"], stages["priority"]
    pipeline = Pipeline(stages)
    declared = {"tier": "mid"}
    gpu = ObservedProfile(runs=12, cpu_s=0.4, cpu_cores=0.9, memory_mb=512.0,
                          accelerator="gpu", accelerator_share=1.0, accelerator_runs=12)
    cases = {
        "plain": (Request("proj.task", "id", (1,), {}, {"aitp_tenant": "acme"}, declared),
                  view()),
        "header labels": (Request("proj.task", "id", (1,), {},
                                  {"aitp_tenant": "acme", "aitp_labels": ["billing"]},
                                  declared), view()),
        "fair-share demoted": (Request("proj.task", "id", (1,), {}, {"aitp_tenant": "acme"},
                                       declared), view(frozenset({"acme"}))),
        "observed profile": (Request("proj.render", "id", (1,), {}, {"aitp_tenant": "acme"},
                                     {}), view(profiles={"proj.render": gpu})),
    }
    print(f"{'case':<22}{'profile+priority p50':>22}{'p99':>8}{'pipeline p50':>14}{'p99':>8}  us")
    for label, (request, snapshot) in cases.items():
        def two(request=request, snapshot=snapshot) -> None:
            d = Decision("takeover", 1000.0, request.task, request.task_id)
            d.tenant = "acme"
            d.predicted_runtime_s, d.predicted_p90_s = 1.0, 2.0
            profile(request, d, snapshot)
            priority(request, d, snapshot)

        def whole(request=request, snapshot=snapshot) -> None:
            pipeline.decide(request, snapshot, 1000.0)

        def baseline(request=request) -> None:
            d = Decision("takeover", 1000.0, request.task, request.task_id)
            d.tenant = "acme"
            d.predicted_runtime_s, d.predicted_p90_s = 1.0, 2.0

        base = measure(baseline, n)[0]
        p50, p99 = measure(two, n)
        w50, w99 = measure(whole, n)
        priority.usage.pending.clear()
        print(f"{label:<22}{p50 - base:>22.2f}{p99 - base:>8.2f}{w50:>14.2f}{w99:>8.2f}")
    print("(profile+priority: minus the cost of building the Decision, "
          f"{base:.2f} us; pipeline: the whole default decision)")


if __name__ == "__main__":
    main()
