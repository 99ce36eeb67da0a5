"""Weighted tier order for AITP workers on Redis: tiers first, no tier starves.

Kombu's Redis transport asks its queue-order strategy for the order of the queues in
each ``BRPOP`` (the first non-empty queue in that order is served) and tells it which
queue was served (``rotate``). :class:`WeightedTierCycle` is such a strategy
(``broker_transport_options['queue_order_strategy']``), doing stride scheduling on two
levels, tiers first, then the tenants within a tier:

* the queues of one tier and accelerator class (``aitp.<tenant>.<acc>.<tier>``, one per
  tenant) form a *group* whose weight is the tier's read weight; a class's over-share
  lane and any other queue are groups of their own (see :class:`WeightPlan`);
* each queue ``q`` has a share of its group, its tenant's fair-share weight (``w_q``, the
  tier's weight times that share, is its weight, see :func:`queue_weights`);
* groups are offered in increasing pass, and within a group its queues in increasing
  pass (ties: heavier first); the served group's pass grows by ``c_q / w_group`` and the
  served queue's by ``c_q / share_q``, where ``c_q`` is the read's *charge*, below;
* a queue that was offered before the served one was empty at that moment, so its pass
  (or, when its whole group was offered before, the group's) is raised to one of its own
  steps past the served one's: nothing can save up credit while idle and then burst, and
  a message arriving in a queue that was empty takes its turn behind a backlogged
  heavier queue instead of going first (raised only to the served queue's pass, an idle
  light queue would stay just ahead of the heavy one it trails, and every message
  arriving in it would be read next: on a worker whose top tier is backlogged, each new
  long task would jump the queue).

Why two levels: with one pass per queue, a tier split over ``n`` tenants' queues was
read as ``n`` tiers. After one tenant's lowest-tier read, the other tenants' lowest-tier
queues (their passes level with it) came before a short task that had just arrived, so
every short task waited for a long read per tenant (placement benchmark, bimodal, two
tenants, exact sizes: mean slowdown 0.51-0.55x FIFO's, against 0.48x with both tenants'
tasks in one queue per tier and 0.47x with the two levels).

**Charges: weights share the worker's time, not its reads.** Tiers are size classes
(``scheduling/size_classes.py``), so one read of a lower tier starts a longer run. A read
of a queue of tier ``t`` and accelerator class ``a`` is charged ``c_q`` = the fleet's
mean observed run of ``(a, t)`` over the shortest such mean of ``a``'s tiers (workers
add every run to the ``usage`` hash, ``scheduling/usage.py``; :func:`follow_usage`
reads it from the live view); between 1 and ``usage.MAX_CHARGE``, and 1 for any other
queue and until a tier's runs are measured. Charged by reads alone, a backlogged lowest
tier with ``1/73`` of the reads took about half the worker's time on the LANL trace (its
jobs run about 10x the top tier's on average), and the short jobs waited behind it.

While every group has work, group ``g`` gets ``(w_g / c_g) / sum(w / c)`` of the reads,
however many tenants' queues it holds, and shares them between its queues by their
tenants' weights; an empty higher tier costs nothing (the read goes to the next queue). A backlogged
queue's pass stands still while the others' grow, so its rank rises with every read it
waits: the effective priority of its oldest message rises with waiting time.

Fair share on the worker side: while a tenant is above its fair share (the ``usage``
source of the worker's live view, see :func:`follow_usage`), its queue of the lowest
tier is read with a further ``1/8`` of its share of that tier, so demotion also works where
producers cannot place a task any lower. Its higher tiers keep their weight: producers
already place its new tasks one tier lower, and reading, say, its ``mid`` queue with
``lo``'s weight as well would put its short tasks level with everyone's long ones (tiers
are size classes), which costs every tenant's mean slowdown for little fairness.

Inside a tenant class the queues are shared, so workers cannot tell a demoted tenant's
messages apart there; producers put them in the class's *over-share lane* of their
tier instead (``aitp.<class>~over.<accelerator>.<tier>``, see
:mod:`celery_aitp.publish.route_stage`), which a worker serving the class reads with
the weight of the tier below (its tier's weight over ``TIER_WEIGHT_RATIO``, the lowest
tier's ``1/8`` for its lane, times the class's ``queue_weight``): behind the class's
other tenants, and the flooder's short tasks still ahead of its long ones. Lanes are
groups of their own, so the bound below covers them.

A worker may keep processes for its higher tiers (:mod:`celery_aitp.worker.reserve`):
while its reserve holds, a read leaves the lowest tier's queues out.

**Bound.** Between two reads of a backlogged group ``g`` (among ``M`` groups of total
weight ``W``, charged ``c_q``; every charge is at least 1) there are at most
``G_g = ceil(c_q * W / w_g) + 2M`` reads of other groups; between two reads of a
backlogged queue ``q`` of ``g`` there are at most ``H_q = ceil(S_g / s_q) + 2m_g``
reads of the group's other queues (``m_g`` queues of total share ``S_g``; ``H_q = 0``
for a group of one queue, and the queues of a tier are charged alike). So there are at
most ``(H_q + 1) * (G_g + 1) - 1`` reads of other queues, and a message with ``k``
messages ahead of it in its queue is read within ``(k + 1) * (H_q + 1) * (G_g + 1)``
reads. With ``c`` pool processes and runs of at most ``R`` seconds, reads happen
at least ``c`` per ``R`` while the worker is saturated, so it waits at most
``(ceil((k + 1) * (H_q + 1) * (G_g + 1) / c) + 1) * R`` (see :func:`longest_wait_s`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from celery_aitp.policy import TIER_WEIGHT_RATIO, Policy
from celery_aitp.priority_policy import TierOrder
from celery_aitp.queues import lane_class, parse_tier_queue
from celery_aitp.scheduling.usage import USAGE_SOURCE, tier_charges
from celery_aitp.worker.reserve import Reserve

#: The strategy's dotted name, as ``queue_order_strategy`` takes it.
STRATEGY = "celery_aitp.worker.tier_cycle:WeightedTierCycle"
#: Pass values are shifted back to 0 beyond this, keeping float steps exact.
_RENORMALISE_AT = 1e6

_lock = threading.Lock()
_demoted: frozenset[str] = frozenset()
#: queue -> charge of one read (absent: 1), from the usage snapshot last followed; a new
#: dict replaces it whole, so a read never sees it half updated
_charges: dict[str, float] = {}
_usage_followed: object = None
#: The worker's reserve for its higher tiers (worker/reserve.py), if it keeps one.
_reserve: Reserve | None = None


class WeightPlan:
    """Read weights of a worker's queues, normal and while their tenant is demoted, and the
    groups they are read in (the tenants' queues of one tier and accelerator together)."""

    def __init__(self, policy: Policy, queues: Iterable[str]) -> None:
        tiers = policy.tier_weights()
        names = policy.tier_names
        lowest = names[-1]
        below = {name: tiers[name] / TIER_WEIGHT_RATIO if name == lowest else tiers[name]
                 for name in names}
        self.weights: dict[str, float] = {}
        self.demoted: dict[str, float] = {}
        self.tenants: dict[str, str] = {}
        #: queue -> ``<accelerator>.<tier>``: the key of its charge (tier_charges)
        self.charge_keys: dict[str, str] = {}
        #: queue -> its group, ``<accelerator>.<tier>`` (a lane or any other queue: itself)
        self.groups: dict[str, str] = {}
        #: group -> its weight: the tier's (a lane's or other queue's: its own)
        self.group_weights: dict[str, float] = {}
        self.default = min(tiers.values())
        for queue in queues:
            parsed = parse_tier_queue(queue)
            if parsed is None or parsed[2] not in tiers:
                continue
            tenant, accelerator, tier = parsed
            self.charge_keys[queue] = f"{accelerator}.{tier}"
            lane = lane_class(tenant)
            if lane is not None and lane in policy.tenant_classes:
                # a class's over-share lane: its tier's weight one tier down, always
                share = policy.tenant_classes[lane].queue_weight
                self.weights[queue] = self.demoted[queue] = \
                    tiers[tier] / TIER_WEIGHT_RATIO * share
                continue
            spec = policy.tenants.get(tenant)
            shared = policy.tenant_classes.get(tenant)
            share = spec.weight if spec else shared.queue_weight if shared else 1.0
            self.weights[queue] = tiers[tier] * share
            self.demoted[queue] = below[tier] * share
            self.tenants[queue] = tenant
            self.groups[queue] = self.charge_keys[queue]
            self.group_weights[self.groups[queue]] = tiers[tier]

    @classmethod
    def from_weights(cls, weights: Mapping[str, float], default: float = 1.0) -> WeightPlan:
        """A plan of given weights, each queue a group of its own (tests, simulations)."""
        plan = cls(Policy(), ())
        plan.weights = dict(weights)
        plan.default = float(default)
        return plan

    def group_of(self, queue: str) -> str:
        return self.groups.get(queue, queue)

    def group_weight(self, group: str) -> float:
        """A tier's weight; a group of one queue: that queue's."""
        weight = self.group_weights.get(group)
        return self.weights.get(group, self.default) if weight is None else weight

    def weight_of(self, queue: str, demoted: frozenset[str] = frozenset()) -> float:
        """The queue's weight: its tier's times its tenant's share, the demoted one while
        its tenant is in ``demoted``."""
        table = self.demoted if demoted and self.tenants.get(queue) in demoted else self.weights
        return table.get(queue, self.default)


#: The plan every :class:`WeightedTierCycle` of this process reads by (:func:`configure`).
_plan = WeightPlan.from_weights({})


def queue_weights(policy: Policy, queues: Iterable[str]) -> tuple[dict[str, float], float]:
    """Read weight of each tier queue, and the weight of any other queue (the lowest tier's).

    ``weight(aitp.<tenant>.<acc>.<tier>) = tier weight * tenant fair-share weight``.
    """
    plan = WeightPlan(policy, queues)
    return plan.weights, plan.default


def strategy_for(policy: Policy, queues: Iterable[str]) -> tuple[str, bool]:
    """(kombu ``queue_order_strategy``, follows usage) for the policy's ``tier_order``.

    For the weighted order this configures this process's weights; the worker's bootstep
    and the replay simulator both choose the strategy here.
    """
    if policy.tier_order is TierOrder.STRICT:
        return "priority", False
    configure(WeightPlan(policy, queues))
    return STRATEGY, True


def configure(plan: WeightPlan | Mapping[str, float], default: float = 1.0) -> None:
    """Set the weights every :class:`WeightedTierCycle` of this process uses (bootstep);
    a mapping of weights makes each queue a group of its own."""
    global _plan, _demoted, _usage_followed, _charges
    if not isinstance(plan, WeightPlan):
        plan = WeightPlan.from_weights(plan, default)
    with _lock:
        _plan = plan
        _charges = {}
        _usage_followed = None
        _demoted = frozenset()


def set_reserve(reserve: Reserve | None) -> None:
    """Keep processes for the higher tiers: while ``reserve`` holds, reads leave the
    lowest tier's queues out (bootstep; None: no reserve)."""
    global _reserve
    _reserve = reserve


def set_demoted(tenants: frozenset[str]) -> None:
    """Tenants above their fair share right now (their lowest tier read behind the others)."""
    global _demoted
    _demoted = frozenset(tenants)


def follow_usage(view: Any) -> None:
    """A live-view listener: keep :func:`set_demoted` and the reads' charges in step with
    the ``usage`` source."""
    global _usage_followed, _charges
    usage = view.sources.get(USAGE_SOURCE)
    demoted = getattr(usage, "demoted", None)
    if isinstance(demoted, frozenset) and demoted != _demoted:
        set_demoted(demoted)
    tier_runtime = getattr(usage, "tier_runtime", None)
    if usage is _usage_followed or not isinstance(tier_runtime, Mapping):
        return
    with _lock:
        charges = tier_charges(tier_runtime)
        _charges = {queue: charges[key] for queue, key in _plan.charge_keys.items()
                    if key in charges}
        _usage_followed = usage
        if _reserve is not None:  # a new worker's starvation bound: worker/reserve.py
            _reserve.follow_fleet(tier_runtime, _plan.charge_keys)


def charge_of(queue: str) -> float:
    return _charges.get(queue, 1.0)


def group_of(queue: str) -> str:
    return _plan.group_of(queue)


def group_weight(group: str) -> float:
    return _plan.group_weight(group)


def step_of(queue: str) -> float:
    """How far one read moves the pass of ``queue``'s group: its charge over the
    group's weight."""
    return charge_of(queue) / group_weight(group_of(queue))


def member_step_of(queue: str) -> float:
    """How far one read moves ``queue``'s pass within its group: its charge over its
    share of the group (its tenant's weight)."""
    return charge_of(queue) * group_weight(group_of(queue)) / weight_of(queue)


def weight_of(queue: str) -> float:
    """The queue's weight: its tier's times its tenant's (a group's weight times the
    queue's share of it)."""
    return _plan.weight_of(queue, _demoted)


def longest_wait_s(weights: WeightPlan | Mapping[str, float], queue: str, ahead: int,
                   processes: int, max_runtime_s: float, charge: float = 1.0) -> float:
    """The documented bound on a message's wait in ``queue`` (module docstring), whose
    reads are charged ``charge``; a mapping of weights: each queue a group of its own."""
    plan = weights if isinstance(weights, WeightPlan) else WeightPlan.from_weights(weights)
    groups = {plan.group_of(q) for q in plan.weights}
    group = plan.group_of(queue)
    gap = math.ceil(charge * sum(map(plan.group_weight, groups)) / plan.group_weight(group)) \
        + 2 * len(groups)
    members = [q for q in plan.weights if plan.group_of(q) == group]
    member_gap = 0 if len(members) == 1 else \
        math.ceil(sum(plan.weights[q] for q in members) / plan.weights[queue]) + 2 * len(members)
    reads = (ahead + 1) * (gap + 1) * (member_gap + 1)
    return (math.ceil(reads / max(1, processes)) + 1) * max_runtime_s


class WeightedTierCycle:
    """A kombu queue-order strategy (``update`` / ``consume`` / ``rotate``)."""

    def __init__(self, it: Any = None) -> None:
        #: The reserve this cycle's reads ask; None: the worker's (:func:`set_reserve`).
        #: The replay gives each simulated worker its own.
        self.reserve: Reserve | None = None
        self.items: list[str] = []
        self.group_passes: dict[str, float] = {}  # group -> pass
        self.passes: dict[str, float] = {}  # queue -> pass within its group
        self._offered: list[str] = []
        self.update(it or [])

    def update(self, it: Iterable[str]) -> None:
        """The queues being consumed changed; a new queue starts level with the lowest
        of its group (a new tenant's queue neither waits behind the tenants already read
        nor takes a run of reads to catch up with them), a new group at the lowest."""
        items = list(it)
        start = min(self.passes.values(), default=0.0)
        lowest: dict[str, float] = {}  # group -> its queues' lowest pass
        for queue, at in self.passes.items():
            group = group_of(queue)
            lowest[group] = min(lowest.get(group, at), at)
        self.passes = {q: self.passes.get(q, lowest.get(group_of(q), start)) for q in items}
        start = min(self.group_passes.values(), default=0.0)
        self.group_passes = {g: self.group_passes.get(g, start)
                             for g in map(group_of, items)}
        self.items[:] = items

    def consume(self, n: int) -> list[str]:
        """The queue order for the next read: groups by lowest pass (heavier first on
        ties), and within a group its queues likewise."""
        index = {q: i for i, q in enumerate(self.items)}
        first: dict[str, int] = {}  # group -> its first queue: a group's queues stay together
        for q in self.items:
            first.setdefault(group_of(q), index[q])

        def rank(q: str) -> tuple[float, float, int, float, float, int]:
            g = group_of(q)
            return (self.group_passes.get(g, 0.0), -group_weight(g), first[g],
                    self.passes.get(q, 0.0), -weight_of(q), index[q])

        order = sorted(self.items, key=rank)
        reserve = self.reserve or _reserve
        if reserve is not None:  # see worker/reserve.py
            if reserve.holds():  # a process kept for the higher tiers
                order = [q for q in order if q not in reserve.lowest] or order
            elif reserve.overdue():  # the lowest tier's oldest task waited long enough
                order.sort(key=lambda q: q not in reserve.lowest)
        order = order[:n]
        self._offered = order
        return order

    def rotate(self, last_used: str) -> str:
        """Charge the served queue; queues offered before it were empty: no credit, and
        their next message waits one of their own steps behind the served queue."""
        reserve = self.reserve or _reserve
        if reserve is not None:
            reserve.read(last_used)
        passes, group_passes = self.passes, self.group_passes
        base = passes.get(last_used)
        if base is None:
            return last_used
        group = group_of(last_used)
        group_base = group_passes.get(group, 0.0)
        for queue in self._offered:
            if queue == last_used:
                break
            other = group_of(queue)
            if other == group:  # an empty queue of the served group
                _raise(passes, queue, base + member_step_of(queue))
            else:  # a group whose every queue was empty
                _raise(group_passes, other, group_base + step_of(queue))
        passes[last_used] = base + member_step_of(last_used)
        group_passes[group] = group_base + step_of(last_used)
        _renormalise(passes)
        _renormalise(group_passes)
        return last_used


def _raise(passes: dict[str, float], key: str, behind: float) -> None:
    """No credit for an empty queue (or group): its next read waits ``behind``."""
    if passes.get(key, behind) < behind:
        passes[key] = behind


def _renormalise(passes: dict[str, float]) -> None:
    low = min(passes.values(), default=0.0)
    if low > _RENORMALISE_AT:
        for key in passes:
            passes[key] -= low
