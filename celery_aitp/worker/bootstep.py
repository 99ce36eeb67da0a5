"""Worker opt-in: ``--aitp-*`` flags and the bootstep that consumes tier queues.

A worker started with ``--aitp-tenant`` consumes ``aitp.<tenant>.<accelerator>.<tier>``
highest tier first, then (unless ``--aitp-no-default-queue``) its usual queues, and
advertises what it serves in the shared store with a short expiry. Every worker of an
app with the middleware installed, flagged or not, also runs the janitor that moves
messages out of tier queues nobody serves any more, and on RabbitMQ the aging passes
that raise long-waiting lower-tier messages (``worker/aging.py``).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import click
from celery import bootsteps, signals

from celery_aitp.deployment import store_url_for
from celery_aitp.errors import PolicyError, StoreError
from celery_aitp.layout import physical_groups
from celery_aitp.policy import Policy, parse_policy
from celery_aitp.queues import queues_of_tier, served_queues
from celery_aitp.redact import redact
from celery_aitp.scheduling.feedback import FeedbackPass
from celery_aitp.worker import acks, aging, reserve, tier_cycle

logger = logging.getLogger(__name__)

WORKER_OPTIONS = (
    click.Option(["--aitp-tenant"], multiple=True,
                 help="Serve this tenant's (or tenant class's) tier queues (repeat, "
                      "comma-separate, or '*' for all)."),
    click.Option(["--aitp-accelerator"], default=None,
                 help="Accelerator class this worker provides (default: the policy's default)."),
    click.Option(["--aitp-tiers"], default=None,
                 help="Comma-separated tiers to serve (default: all tiers)."),
    click.Option(["--aitp-no-default-queue"], is_flag=True, default=False,
                 help="Do not consume the default queue (other queues given with -Q "
                      "are kept)."),
    click.Option(["--aitp-express"], is_flag=True, default=False,
                 help="An express worker: serve only the top tier, not the default queue. "
                      "Run one with a process or two beside the regular workers, on the "
                      "same machines: short tasks then start while every regular process "
                      "holds a long one (docs/placement.md)."),
    click.Option(["--aitp-strict/--aitp-no-strict"], default=True,
                 help="Acknowledge tier-queue deliveries after the run so no lower-tier "
                      "task is held in reserve (default; a task's own acks_late=False is "
                      "kept); --aitp-no-strict keeps each task's acks, with up to one "
                      "reserved task per pool process."),
)


class WorkerPlan:
    """What one AITP worker serves, validated against the policy."""

    def __init__(self, policy: Policy, tenants: Any, accelerator: str | None,
                 tiers: str | None, no_default_queue: bool, express: bool = False) -> None:
        self.tenants = _parse_tenants(policy, tenants)
        self.accelerator = accelerator or policy.default_accelerator
        if self.accelerator not in policy.accelerators:
            raise PolicyError(f"--aitp-accelerator: unknown class {self.accelerator!r} "
                              f"(policy accelerators: {', '.join(policy.accelerators)})")
        if express and tiers:
            raise PolicyError("--aitp-express serves the top tier only: leave out "
                              f"--aitp-tiers {tiers!r} (or use it alone)")
        if express and not self.tenants:
            raise PolicyError("--aitp-express needs --aitp-tenant (which tenants' top "
                              "tier to serve; '*' for all)")
        self.tiers = _parse_tiers(policy, tiers) if not express else list(policy.tier_names[:1])
        self.no_default_queue = bool(no_default_queue or express)
        self.express = bool(express)
        self.classes = frozenset(policy.tenant_classes)

    @property
    def enabled(self) -> bool:
        return bool(self.tenants)

    def queue_names(self) -> list[str]:
        """Tier queues, highest tier first, then tenants in the order given; then the
        over-share lanes of the classes served, of the same tiers."""
        return served_queues(self.tenants, self.classes, self.accelerator, self.tiers)


def _split(values: Any) -> list[str]:
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    return [v.strip() for value in values for v in str(value).split(",") if v.strip()]


def _parse_tenants(policy: Policy, values: Any) -> list[str]:
    """Owners of the tier queues to serve: tenants with queues of their own and tenant
    classes (whose queues every tenant of the class shares); ``*``: all of them."""
    names = _split(values)
    owners = policy.queue_owners()
    if "*" in names:
        return list(owners)
    shared = [f"{n} (shares the queues of class {policy.queue_owner(n)!r}: serve that)"
              for n in names if n in policy.tenants and n not in owners]
    if shared:
        raise PolicyError(f"--aitp-tenant: {', '.join(shared)}")
    unknown = [n for n in names if n not in owners]
    if unknown:
        raise PolicyError(f"--aitp-tenant: unknown tenant(s) {', '.join(unknown)} "
                          f"(policy tenants and classes: {', '.join(owners)})")
    return list(dict.fromkeys(names))


def _parse_tiers(policy: Policy, value: str | None) -> list[str]:
    names = _split(value)
    if not names:
        return list(policy.tier_names)
    unknown = [n for n in names if n not in policy.tier_names]
    if unknown:
        raise PolicyError(f"--aitp-tiers: unknown tier(s) {', '.join(unknown)} "
                          f"(policy tiers: {', '.join(policy.tier_names)})")
    return [t for t in policy.tier_names if t in names]  # always highest first


def refuse_quorum_queues(app: Any, driver: str) -> None:
    """A tier worker on RabbitMQ refuses quorum queues among its app's queues.

    Tier queues are classic priority queues (``x-max-priority``; quorum queues know two
    priorities only). And once Celery finds a quorum queue (``task_default_queue_type``
    ``quorum``, or a queue declared with ``x-queue-type: quorum``), it switches the worker
    to per-consumer QoS: a prefetch per queue instead of per channel, so a worker reading
    many tier queues could hold a lower-tier message while a higher one waits.
    """
    if driver != "amqp":
        return
    from celery.utils.quorum_queues import detect_quorum_queues

    found, name = detect_quorum_queues(app, driver)
    if found:
        raise PolicyError(
            f"--aitp-tenant on RabbitMQ: queue {name!r} is a quorum queue; tier queues are "
            "classic priority queues and tier order needs one prefetch per channel, which "
            "Celery gives up with quorum queues. Run tier workers for an app whose queues "
            "are classic (task_default_queue_type='classic'), or serve the quorum queues "
            "from workers without --aitp-tenant.")


def refuse_express_on_amqp(plan: WorkerPlan, driver: str) -> None:
    """An express worker needs a broker queue per tier: on RabbitMQ a tenant's tiers share
    one priority queue, so it would take long tasks as any process does."""
    if plan.express and driver == "amqp":
        raise PolicyError(
            "--aitp-express on RabbitMQ: a tenant's tiers share one broker queue there, so "
            "an express worker would take lower-tier tasks too. Use it with a Redis "
            "broker, or give short work an accelerator class of its own and workers for it.")


class WorkerRefused(PolicyError, click.UsageError):
    """A worker's flags (or its broker settings) do not fit the policy: ``celery worker``
    prints the reason as a usage error, without a traceback, and exits 2."""


class AitpWorkerStep(bootsteps.StartStopStep):
    """Sets up tier consumption before the consumer starts; advertises and cleans up."""

    label = "aitp"

    def __init__(self, worker: Any, aitp_tenant: Any = None, aitp_accelerator: str | None = None,
                 aitp_tiers: str | None = None, aitp_no_default_queue: bool = False,
                 aitp_strict: bool = True, aitp_express: bool = False, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        app = worker.app
        self.middleware = app.aitp
        flagged = aitp_tenant is not None or aitp_accelerator is not None or \
            aitp_tiers is not None or aitp_no_default_queue or aitp_express
        try:
            self.middleware.adopt_active_policy()  # a restart plans from the applied policy
            policy = self.middleware.policy
        except PolicyError as exc:
            if flagged:  # it cannot serve tiers it cannot name
                raise WorkerRefused(str(exc)) from None
            # A standard worker serves the default queue, where every producer with the
            # same broken policy sends its tasks (config_error): it runs, without AITP.
            logger.error("aitp: %s; this worker serves Celery's queues without AITP",
                         redact(exc))
            policy, self.runs_aitp = parse_policy({}), False
        else:
            self.runs_aitp = True
        try:
            self.plan = WorkerPlan(policy, aitp_tenant, aitp_accelerator, aitp_tiers,
                                   aitp_no_default_queue, aitp_express)
            self.runs_aitp = self.runs_aitp and self._check_store(app)
            if self.plan.enabled:
                refuse_quorum_queues(app, self.middleware.broker_driver)
                refuse_express_on_amqp(self.plan, self.middleware.broker_driver)
        except PolicyError as exc:
            raise WorkerRefused(str(exc)) from None
        self.hostname = worker.hostname
        self.concurrency = getattr(worker, "concurrency", None) or 1
        self._occupancy: Any = None
        self._follow_usage = False
        self._reserve: reserve.Reserve | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        if self.plan.enabled:
            self._consume_tiers(worker, aitp_strict)
            observer = getattr(app, "_aitp_observer", None)
            if observer is not None:  # runs record the class they ran on
                observer.accelerator = self.plan.accelerator

    def _check_store(self, app: Any) -> bool:
        """Whether a store URL is known (RabbitMQ needs an explicit one).

        A flagged worker cannot work without it and refuses to start; a standard worker
        keeps running the default queue, without the janitor, and says why.
        """
        try:
            store_url_for(self.middleware.settings, app.conf.broker_url)
        except PolicyError as exc:
            if self.plan.enabled:
                raise
            logger.error("aitp: %s; this worker runs without the janitor", redact(exc))
            return False
        return True

    def _consume_tiers(self, worker: Any, strict: bool) -> None:
        app = worker.app
        queues = app.amqp.queues
        # Logical tier queues, highest first, onto broker queues (the same list on
        # Redis; one priority queue per tenant and accelerator on RabbitMQ).
        names = list(physical_groups(self.middleware.layout, self.plan.queue_names()))
        for name in names:
            queues.add(self.middleware.queue(name))
        others = [] if self.plan.express else [  # an express worker: its tier alone
            q for q in queues.consume_from  # the rest: what -Q (or Celery) chose, and
            if not (self.plan.no_default_queue and q == app.conf.task_default_queue)]
        queues.select(names + [q for q in others if q not in names])
        # Tiers in order: read queues by tier (weighted, so lower tiers keep a guaranteed
        # share; or strictly), reserve at most one message per pool process (prefetch is
        # per channel, so it holds for every queue of this worker), and in strict mode
        # none beyond the running ones: tier deliveries ack after the run (worker/acks.py).
        configured = getattr(worker, "prefetch_multiplier", 1)
        if configured != 1:
            logger.info("aitp: prefetch multiplier %s -> 1 (tier order)", configured)
        worker.prefetch_multiplier = 1
        if self.middleware.broker_driver == "redis":
            options = dict(app.conf.broker_transport_options or {})
            options["queue_order_strategy"] = self._order_strategy(names)
            if strict and self._keep_reserve(names):  # see worker/reserve.py
                options.setdefault("polling_interval", reserve.SAMPLE_S)
            app.conf.broker_transport_options = options
        if strict:
            plan = acks.ack_tier_deliveries_late(app, names)
            for line in plan.warnings():
                logger.warning("%s", line)
        logger.info("aitp: consuming %s", ", ".join(queues.consume_from))

    def _keep_reserve(self, names: list[str]) -> bool:
        """Keep ``reserve.processes`` for the higher tiers, if this worker can: weighted
        order, enough processes, and queues of the lowest tier and of a higher one."""
        policy = self.middleware.policy
        kept = policy.reserve.processes
        lowest = reserve.reserved_queues(policy, names, self.concurrency)
        if not lowest:
            tier_cycle.set_reserve(None)
            return False
        self._reserve = reserve.Reserve(lowest, self.concurrency, kept,
                                        policy.reserve.max_wait_runs,
                                        counters=self.middleware.counters)
        tier_cycle.set_reserve(self._reserve)
        logger.info("aitp: %s of %s processes kept for the higher tiers", kept,
                    self.concurrency)
        return True

    def _order_strategy(self, names: list[str]) -> str:
        """The kombu queue-order strategy for the policy's ``tier_order``."""
        strategy, self._follow_usage = tier_cycle.strategy_for(self.middleware.policy, names)
        return strategy

    def start(self, worker: Any) -> None:
        from celery_aitp.worker.janitor import Janitor

        self._stop.clear()
        if not self.runs_aitp:
            return
        try:  # this process's counters (e.g. 'evacuated') are shipped by its live view
            self.middleware.live.current()
        except Exception as exc:  # a store outage must not stop the worker
            logger.warning("aitp: live view not started: %s", redact(repr(exc)))
        if self.plan.enabled:
            self._spawn("aitp-advertise", self._advertise_loop)
            signals.worker_shutting_down.connect(self._on_shutting_down, sender=self.hostname,
                                                 weak=False)
        if self._follow_usage:  # fair share on the reading side: see worker/tier_cycle.py
            live = self.middleware.live
            live.on_refresh(tier_cycle.follow_usage)
            live.current()
        janitor = Janitor(self.middleware)
        self._spawn("aitp-janitor", lambda: janitor.run(self._stop))
        policy = self.middleware.policy
        if policy.spill.enabled:  # what producers spill by: scheduling/spill.py
            reporter = self._occupancy = self._reporter(worker)
            self._spawn("aitp-occupancy", lambda: reporter.run(self._stop))
        if policy.feedback.enabled:  # boosts for tenants missing SLAs: scheduling/feedback.py
            feedback = FeedbackPass(self.middleware.store, policy,
                                    self.middleware.settings.evacuate_interval_s)
            self._spawn("aitp-feedback", lambda: feedback.run(self._stop))
        if self._reserve is not None:  # the lowest tier's oldest wait: worker/reserve.py
            sampler = reserve.ReserveSampler(self.middleware, self._reserve)
            self._spawn("aitp-reserve", lambda: sampler.run(self._stop))
        if aging.enabled(self.middleware.policy, self.middleware.broker_driver):
            ager = aging.Ager(self.middleware)  # RabbitMQ's no-starvation: worker/aging.py
            self._spawn("aitp-aging", lambda: ager.run(self._stop))

    def _reporter(self, worker: Any) -> Any:
        from celery_aitp.worker.occupancy import OccupancyReporter

        app = worker.app

        def consumes_default() -> bool:
            try:
                return app.conf.task_default_queue in app.amqp.queues.consume_from
            except Exception:  # unknown: a standard worker consumes it unless told not to
                return not self.plan.no_default_queue

        queues = self.plan.queue_names() if self.plan.enabled else []
        return OccupancyReporter(self.middleware, self.hostname, self.concurrency,
                                 self.plan.accelerator, queues, consumes_default)

    def stop(self, worker: Any) -> None:
        self._stop.set()
        if self._occupancy is not None:
            self._occupancy.withdraw()
        if self.plan.enabled:
            signals.worker_shutting_down.disconnect(self._on_shutting_down,
                                                    sender=self.hostname)
            self._withdraw()

    def _withdraw(self) -> None:
        try:
            self.middleware.store.withdraw(self.hostname)
        except StoreError as exc:
            logger.warning("aitp: could not withdraw advertisement: %s", redact(exc))

    def _spawn(self, name: str, target: Any) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _on_shutting_down(self, **_: Any) -> None:
        """A warm shutdown reads no more tasks but may wait hours for the running ones:
        stop advertising now (the advertise thread withdraws), or producers would keep
        routing to queues nobody reads until it ends."""
        self._stop.set()

    def _advertise_loop(self) -> None:
        period = self.middleware.settings.worker_ttl_s / 3
        while True:
            try:
                self.advertise()
                self._follow_express()
            except StoreError as exc:
                logger.warning("aitp: advertisement failed: %s", redact(exc))
            if self._stop.wait(period):
                self._withdraw()
                return

    def advertise(self) -> None:
        """Say which tier queues this worker reads, for the next ``worker_ttl_s``.

        What it reads *now*: ``celery control cancel_consumer`` takes a queue away at run
        time, and a queue still advertised looked served, so producers kept routing to
        it and the janitor left its tasks there for good. The same for the default
        queue (``-Q`` without it)."""
        app = self.middleware.app
        consumed = app.amqp.queues.consume_from
        physical = self.middleware.layout.physical
        queues = [q for q in self.plan.queue_names() if physical(q) in consumed]
        info = {"tenants": self.plan.tenants, "accelerator": self.plan.accelerator,
                "tiers": self.plan.tiers,
                "default_queue": app.conf.task_default_queue in consumed,
                "express": self.plan.express}
        self.middleware.store.advertise(self.hostname, queues, info,
                                        self.middleware.settings.worker_ttl_s)

    def _follow_express(self) -> None:
        """Let the reserve stand aside while an express worker reads this worker's top
        tier (``worker/reserve.py``), and say so when that changes."""
        kept = self._reserve
        if kept is None:
            return
        queues = queues_of_tier(self.plan.queue_names(), self.middleware.policy.tier_names[0])
        now, workers = self.middleware.store.workers_at()  # heartbeats: the server's clock
        live = reserve.express_covers(workers, queues, now,
                                      self.middleware.settings.worker_ttl_s)
        if live != kept.express_live:
            logger.info("aitp: %s", "an express worker reads the top tier: the reserve "
                        "stands aside" if live else "no express worker reads the top tier: "
                        "the reserve keeps its processes again")
        kept.express_live = live


def register_worker_extensions(app: Any) -> None:
    """Add the flags, the bootstep and the run observer to ``app`` (idempotent)."""
    from celery_aitp.core import running
    from celery_aitp.worker.observe import connect_observer

    acks.track_declarations()  # before the app's tasks are created (at finalisation)
    options = app.user_options["worker"]
    if not any(getattr(o, "name", None) == "aitp_tenant" for o in options):
        for option in WORKER_OPTIONS:
            options.add(option)
    app.steps["worker"].add(AitpWorkerStep)
    connect_observer(app)
    running.connect(app)
