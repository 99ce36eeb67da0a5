"""Fair share and the starvation bound with 1,000 tenants sharing a class's queues.

The same checks as ``test_scheduling_sim.py`` (real stages, sources, ledger and tier
order on a virtual clock, ``tests/support/scheduler_sim.py``), with every tenant in one
tenant class: the worker reads the class's three queues, the priority stage demotes a
tenant above its fair share at publish time, per tenant.
"""

from __future__ import annotations

import random

from kombu.utils.scheduling import priority_cycle

from celery_aitp.policy import parse_policy
from celery_aitp.publish.route_stage import RouteStage
from tests.support.scheduler_sim import Job, Simulation, SimWorker, waits_within_bound

TIERS = [{"name": "hi", "sla_s": 1}, {"name": "mid", "sla_s": 10}, {"name": "lo", "sla_s": 60}]
N = 1000
QUIET = [f"c{i:04d}" for i in range(N - 1)]
FLOOD = "flood"


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[int(0.95 * (len(ordered) - 1))]


def class_sim(store, workers: int = 2, refresh_s: float = 1.0) -> Simulation:
    """N tenants, all listed in class ``small`` (sharing aitp.small.cpu.<tier>)."""
    tenants = {t: {"tenant_class": "small"} for t in [*QUIET, FLOOD]}
    policy = parse_policy({"tiers": TIERS, "stage": "takeover",
                           "tenant_classes": {"small": {}},
                           "tenants": {**tenants, "default": {}},
                           "fair_share": {"half_life_s": 120}})
    sim = Simulation(policy, store, [SimWorker("w", ["small"], "cpu", processes=workers)],
                     refresh_s=refresh_s)
    sim.pipeline = sim.pipeline.replace("route", RouteStage(policy))  # class queues
    return sim


def fair_share_run(store, flood: bool) -> tuple[list[Job], Simulation]:
    """Quiet tenants: every 60 s a burst of 100 tasks of 0.15 to 0.25 s, each of another
    quiet tenant (a sixth of the capacity; every quiet tenant runs about one task). The
    flooding tenant: 12 such tasks a second from t = 0, more than two processes serve.
    All declare ``mid`` as their floor; by size they take ``hi`` or ``mid``."""
    sim = class_sim(store)
    rng = random.Random(3)
    for burst in range(1, 11):
        for k in range(100):
            tenant = QUIET[((burst - 1) * 100 + k) % len(QUIET)]
            sim.publish_at(burst * 60.0, "work", tenant, rng.uniform(0.15, 0.25),
                           {"tier": "mid"})
    if flood:
        t = 0.0
        while t < 660:
            t += rng.expovariate(12.0)
            sim.publish_at(t, "work", FLOOD, rng.uniform(0.15, 0.25), {"tier": "mid"})
    return sim.run(until=720.0), sim


def quiet_waits(done: list[Job], tier: str) -> list[float]:
    return [j.started_at - j.published_at for j in done if j.tenant != FLOOD and j.tier == tier]


def test_a_flooding_tenant_among_a_thousand_is_demoted_alone_and_kept_out_of_the_top(store):
    """Fair share stays per tenant inside the class: only the flooder is demoted, from
    the first refresh at which other tenants have usage (before that it is the only
    active tenant), and from then on none of its tasks takes the top tier, so the quiet
    tenants' top-tier tasks wait as long as without it.

    Not claimed (measured, see docs/scale.md): the quiet tenants' tasks in a lower tier
    share their queue with the flooder's demoted backlog and wait behind it (FIFO inside
    one queue); queues of their own are read one tier lower by workers instead."""
    alone, _ = fair_share_run(store, flood=False)
    store.client.flushdb()
    both, sim = fair_share_run(store, flood=True)
    assert len([j for j in alone if j.tenant != FLOOD]) == 1000
    waiting = [job for queue in sim.queues.values() for job in queue]
    assert len({j.tenant for j in both + waiting}) == N  # every tenant published
    assert {j.queue for j in both + waiting} <= {f"aitp.small.cpu.{t['name']}" for t in TIERS}
    usage = sim.values["usage"]
    assert usage.demoted == {FLOOD}
    assert len(usage.fair) == N and usage.fair[FLOOD] == 1 / N  # one share per tenant
    late = [j.tier for j in both if j.tenant == FLOOD and j.published_at > 70]
    assert late and "hi" not in late  # demoted one tier below its size class
    early = [j.tier for j in both if j.tenant == FLOOD and j.published_at < 55]
    assert "hi" in early  # alone, before others had usage: not demoted
    hi_alone, hi_both = quiet_waits(alone, "hi"), quiet_waits(both, "hi")
    assert len(hi_both) >= 500
    assert p95(hi_both) <= 1.2 * p95(hi_alone), (p95(hi_both), p95(hi_alone))


def starvation_run(store, strict: bool) -> tuple[list[Job], Simulation]:
    """Tasks declared ``hi`` from 1,000 tenants (round-robin) at 1.2x what two
    processes serve, and a trickle of ``lo`` tasks of other tenants of the class."""
    sim = class_sim(store, refresh_s=5.0)
    if strict:
        sim.workers[0].cycle = priority_cycle(list(sim.workers[0].queues))
    rng = random.Random(5)
    t, i = 0.0, 0
    while t < 300:
        t += rng.expovariate(12.0)
        sim.publish_at(t, "urgent", QUIET[i % len(QUIET)], rng.uniform(0.1, 0.3),
                       {"tier": "hi"})
        i += 1
    for burst in range(10):
        for k in range(3):
            sim.publish_at(2.5 + 30.0 * burst, "report", QUIET[-1 - 3 * burst - k], 0.3,
                           {"tier": "lo"})
    return sim.run(until=300.0), sim


def test_no_task_of_a_thousand_tenants_waits_longer_than_the_bound(store):
    done, sim = starvation_run(store, strict=False)
    assert len({j.tenant for j in done}) >= N - 1
    lows = [j for j in done if j.task == "report"]
    assert len(lows) == 30 and {j.queue for j in lows} == {"aitp.small.cpu.lo"}
    waits = waits_within_bound(sim, done, lows, processes=2)
    assert max(waits) > 5  # they did wait for lo's share of the reads
    store.client.flushdb()
    strict_done, _ = starvation_run(store, strict=True)
    assert sum(j.task == "report" for j in strict_done) < 3  # without the bound: starved
