"""Publish overhead: plain Celery against celery_aitp in each stage, side by side.

Every variant is its own Celery app publishing the same tasks (same names, arguments and
headers) to the same real broker in the same process; in each round the variants take
turns every 25 tasks (the order rotates), and each round also runs the variant's
refresher round (view, sources, counters, decision records) inside its timed part, so
background work is charged to whoever caused it. Prints microseconds per task (wall
clock and process CPU) and the ratio to plain Celery (median over rounds of the per-round
ratio). The last variant publishes one precomputed decision for every task: what Celery
and kombu cost for the header and the tier route alone, the floor under any decision.

    python benchmarks/publish_overhead.py                      # Redis only
    python benchmarks/publish_overhead.py --amqp amqp://guest:guest@127.0.0.1:5672//

Environment: AITP_BENCH_REDIS_URL (default redis://127.0.0.1:6379/14) and
AITP_BENCH_AMQP_URL. Target: takeover at most 1.05x plain Celery.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from celery import Celery  # noqa: E402

import celery_aitp  # noqa: E402
from celery_aitp.core.request import header_json  # noqa: E402
from celery_aitp.layout import physical_groups  # noqa: E402
from celery_aitp.queues import all_tier_queues  # noqa: E402

#: The variant that publishes one precomputed decision for every task (no pipeline).
FLOOR = "floor: fixed decision"
TASKS = ("media.resize", "reports.build", "ml.fit", "etl.batch", "mail.send", "geo.route")


class Variant:
    """One app: plain Celery, or celery_aitp in one stage (with or without a model)."""

    def __init__(self, index: int, name: str, broker: str, store_url: str, run: str,
                 stage: str | None, with_model: bool = True) -> None:
        self.name = name
        self.stage = stage
        self.with_model = with_model
        self.app = Celery(f"bench{index}-{run}", broker=broker)
        self.app.conf.task_default_queue = f"bench-{run}"
        self.app.conf.broker_connection_retry_on_startup = True
        self.middleware: Any = None
        if stage is not None:
            self.middleware = celery_aitp.install(
                self.app, policy=common.policy_for(run, stage), store_url=store_url,
                key_prefix=f"bench-{run}-{index}", refresh_interval_s=60,
                max_staleness_s=600)  # refreshed by the rounds, timed (see flush)
        self.tasks = {name: self.app.task(name=name, shared=False)(_noop) for name in TASKS}
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.publish_only: list[float] = []  # wall of the publishes, the refresher round aside

    def prepare(self, queues: list[str], bundle: Any, history: list[dict[str, Any]]) -> None:
        if self.middleware is None:
            return
        self.middleware.store.advertise("bench-worker@localhost", queues, {}, ttl_s=3600)
        self.middleware.store.write_stage({"stage": self.stage, "split": {"percent": 50}},
                                          who="benchmark")
        common.install_model(self.middleware, bundle if self.with_model else None, history)

    def fix_decision(self, name: str, args: list[Any], kwargs: dict[str, Any],
                     headers: dict[str, Any]) -> None:
        """Make every publish reuse one precomputed decision: the same ``aitp`` header
        (fresh ``decided_at``) and tier queue for every task, no pipeline. What is left is
        what Celery and kombu spend on the header and the tier route: the floor under any
        decision."""
        mw = self.middleware
        decision = mw.pipeline.decide(
            _request(name, args, kwargs, headers), mw.live.current(), time.time())
        prefix, queue = decision.header_prefix(), decision.queue or ""

        def on_publish(task: str, message: Any, opts: dict[str, Any]) -> dict[str, Any]:
            opts.pop("_aitp_auto", None)
            found = dict(opts.get("headers") or {})
            found["aitp"] = header_json(prefix, time.time())
            opts["headers"] = found
            mw.annotator.send_to_tier(opts, queue)
            return opts

        mw.on_publish = on_publish

    def publish(self, messages: list[tuple[str, list[Any], dict[str, Any], dict[str, Any]]],
                flush: bool = True) -> tuple[float, float]:
        tasks = self.tasks
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for name, args, kwargs, headers in messages:
            tasks[name].apply_async(args, kwargs, headers=headers)
        if flush:
            self.flush()
        return time.perf_counter() - wall0, time.process_time() - cpu0

    def flush(self) -> None:
        """A whole refresher round (view, sources, counters, records), charged to this
        variant's round: the background thread itself waits a minute between rounds, so
        none of its work lands in another variant's time."""
        if self.middleware is not None:
            self.middleware.live.refresh()

    def timed_flush(self) -> tuple[float, float]:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        self.flush()
        return time.perf_counter() - wall0, time.process_time() - cpu0

    def close(self) -> None:
        if self.middleware is not None:
            common.close(self.middleware)


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def _request(name: str, args: list[Any], kwargs: dict[str, Any],
             headers: dict[str, Any]) -> Any:
    from celery_aitp.core.request import Request

    return Request(name, "floor", args, kwargs, headers, {}, None, time.time())


def messages_for(records: list[dict[str, Any]]) -> list[Any]:
    return [(r["task"], r["args"], r["kwargs"], {"aitp_tenant": r["tenant"]}) for r in records]


def empty_queues(broker: str, queues: list[str]) -> None:
    """Drop what the round published (outside the timed part)."""
    from kombu import Connection

    with Connection(broker) as conn:
        channel = conn.default_channel
        for queue in queues:
            try:
                channel.queue_purge(queue)
            except Exception:  # noqa: S112 - a queue that was never declared
                continue


def delete_queues(broker: str, queues: list[str]) -> None:
    """Delete the run's queues and their exchanges (each queue has one of its name)."""
    from kombu import Connection

    with Connection(broker) as conn:
        for queue in queues:
            for delete in (conn.default_channel.queue_delete,
                           conn.default_channel.exchange_delete):
                try:
                    delete(queue)
                except Exception:  # noqa: S112 - already gone (the channel reopens)
                    conn.close()
                    conn.connect()
                    continue


def run_broker(label: str, broker: str, store_url: str, args: argparse.Namespace,
               bundle: Any, history: list[dict[str, Any]], messages: list[Any], run: str
               ) -> list[tuple[str, float, float, float, float]]:
    tenants = list(common.tenants_for(run).values())
    queues = all_tier_queues(tenants, ("cpu", "gpu"), ("hi", "mid", "lo"))
    plan = [("plain", None, True), ("coexistence", "coexistence", True),
            ("split 50%", "split", True), ("takeover, cold start", "takeover", False),
            ("takeover", "takeover", True), (FLOOR, "takeover", True)]
    variants = [Variant(i, name, broker, store_url, run, stage, model)
                for i, (name, stage, model) in enumerate(plan)]
    for variant in variants:
        variant.prepare(queues, bundle, history)
    variants[-1].fix_decision(*messages[0])
    # where those tier queues wait on this broker (RabbitMQ: one per tenant and accelerator)
    layout = next(v.middleware.layout for v in variants if v.middleware is not None)
    all_queues = [f"bench-{run}", *dict.fromkeys([*queues, *physical_groups(layout, queues)])]
    try:
        for variant in variants:  # warm-up: connections, declarations, caches
            variant.publish(messages[:100])
        empty_queues(broker, all_queues)
        slices = [messages[i:i + args.slice] for i in range(0, len(messages), args.slice)]
        for r in range(args.rounds):
            # the variants take turns every ``--slice`` tasks, so a change in the machine's
            # speed (it has bursts) weighs on all of them alike
            totals = {id(v): [0.0, 0.0] for v in variants}
            for k, part in enumerate(slices):
                shift = (r + k) % len(variants)
                for variant in variants[shift:] + variants[:shift]:
                    wall, cpu = variant.publish(part, flush=False)
                    totals[id(variant)][0] += wall
                    totals[id(variant)][1] += cpu
            for variant in variants:
                wall, cpu = variant.timed_flush()
                total = totals[id(variant)]
                variant.wall.append((total[0] + wall) / len(messages) * 1e6)
                variant.cpu.append((total[1] + cpu) / len(messages) * 1e6)
                variant.publish_only.append(total[0] / len(messages) * 1e6)
            empty_queues(broker, all_queues)
            print(f"\r{label}: round {r + 1}/{args.rounds}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
    finally:
        for variant in variants:
            variant.close()
        delete_queues(broker, all_queues)
    plain = variants[0]
    rows = []
    for v in variants:
        ratio = common.median([w / p for w, p in zip(v.wall, plain.wall, strict=True)])
        cpu_ratio = common.median([c / p for c, p in zip(v.cpu, plain.cpu, strict=True)])
        publish_ratio = common.median([c / p for c, p in zip(v.publish_only, plain.publish_only,
                                                              strict=True)])
        rows.append((v.name, common.median(v.wall), ratio, common.median(v.cpu), cpu_ratio,
                     publish_ratio))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redis", default=common.REDIS_URL, help="Redis broker and store URL")
    parser.add_argument("--amqp", default=common.AMQP_URL, help="also measure this RabbitMQ")
    parser.add_argument("--tasks", type=int, default=400, help="tasks per variant per round")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--slice", type=int, default=25,
                        help="tasks a variant publishes before the next one's turn")
    args = parser.parse_args()

    run = common.tag()
    records = common.workload(6000, run, seed=3)
    print("training the benchmark model ...", file=sys.stderr)
    bundle = common.trained(records[:5000]).bundle
    messages = messages_for(common.workload(args.tasks, run, seed=11, compact=False))
    history = records[:5000]
    results = []
    try:
        results.append(("redis", run_broker("redis", args.redis, args.redis, args, bundle,
                                            history, messages, run)))
        if args.amqp:
            results.append(("rabbitmq", run_broker("rabbitmq", args.amqp, args.redis, args,
                                                   bundle, history, messages, run)))
    finally:
        common.cleanup(args.redis, [f"bench-{run}*", f"_kombu.binding*.bench-{run}*",
                                    f"_kombu.binding*.aitp.*-{run}.*"])
    print(f"\npublish overhead: {args.tasks} tasks x {args.rounds} rounds per variant, "
          "interleaved; median us/task; ratio = median of per-round ratios to plain Celery\n")
    print("(publish only: the same ratio without the refresher round, i.e. what the publishing\n"
          " thread itself spends; the refresher round runs in the background in production)\n")
    print(f"{'broker':9} {'variant':22} {'wall us':>9} {'ratio':>7} {'cpu us':>9} {'ratio':>7} "
          f"{'publish only':>13}")
    for broker, rows in results:
        for name, wall, ratio, cpu, cpu_ratio, publish_ratio in rows:
            print(f"{broker:9} {name:22} {wall:9.1f} {ratio:7.3f} {cpu:9.1f} {cpu_ratio:7.3f} "
                  f"{publish_ratio:13.3f}")


if __name__ == "__main__":
    main()
