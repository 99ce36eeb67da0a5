"""A generated workload of observation records, for benchmarks, tests and trying things out.

Runtimes depend non-linearly on the arguments and on the tenant (whose data is bigger or
smaller), with log-normal noise (sigma 0.3) and, for two tasks, occasional slow runs no
argument explains (a cold cache: 15% of runs, 3x slower); consecutive runs of one
(tenant, task) differ a lot, as in real traffic, so "the same as last time" is a weak
guess. Deterministic for a seed.

===================  =============================  ========================================
task                 arguments                      runtime (seconds, before tenant factor)
===================  =============================  ========================================
``media.resize``     ``width, height, quality=``    ``w*h / 2e6``, x1.8 above quality 80
``reports.build``    ``rows=, charts=``             ``1e-5 * n log2 n``, x3 with charts
``ml.fit``           ``samples, depth``             ``samples/1000 * 2**depth / 40``
``etl.batch``        ``[items...]``                 ``0.002 * len(items) ** 1.3``
``mail.send``        ``user_id``                    ``0.05`` (the id does not matter)
``geo.route``        ``points=``                    ``points/5000``, 2.0 above 500 points
===================  =============================  ========================================
"""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Iterator
from typing import Any

TENANTS = {"acme": 1.0, "globex": 2.5, "initech": 0.4}
NOISE_SIGMA = 0.3
#: Tasks whose runs are sometimes slow for reasons no argument shows (share, factor).
COLD_CACHE = {"reports.build": (0.15, 3.0), "geo.route": (0.15, 3.0)}


def _resize(rng: random.Random) -> tuple[list[Any], dict[str, Any], float]:
    w, h = int(rng.lognormvariate(6.5, 0.8)), int(rng.lognormvariate(6.3, 0.8))
    quality = rng.choice((60, 75, 85, 95))
    return [w, h], {"quality": quality}, 0.002 + w * h / 2e6 * (1.8 if quality > 80 else 1.0)


def _report(rng: random.Random) -> tuple[list[Any], dict[str, Any], float]:
    rows = int(rng.lognormvariate(8, 1.5)) + 1
    charts = rng.random() < 0.4
    return [], {"rows": rows, "charts": charts}, (
        0.01 + 1e-5 * rows * math.log2(rows + 1) * (3.0 if charts else 1.0))


def _fit(rng: random.Random) -> tuple[list[Any], dict[str, Any], float]:
    samples, depth = int(rng.lognormvariate(8, 1.0)), rng.randint(2, 10)
    return [samples, depth], {}, 0.02 + samples / 1000 * 2 ** depth / 40


def _etl(rng: random.Random) -> tuple[list[Any], dict[str, Any], float]:
    n = int(rng.lognormvariate(4, 1.2)) + 1
    return [list(range(n))], {}, 0.002 * n ** 1.3


def _mail(rng: random.Random) -> tuple[list[Any], dict[str, Any], float]:
    return [rng.randint(1, 10**6)], {}, 0.05


def _route(rng: random.Random) -> tuple[list[Any], dict[str, Any], float]:
    points = int(rng.lognormvariate(5.5, 1.0))
    return [], {"points": points}, 2.0 if points > 500 else 0.005 + points / 5000


TASKS = {
    "media.resize": _resize,
    "reports.build": _report,
    "ml.fit": _fit,
    "etl.batch": _etl,
    "mail.send": _mail,
    "geo.route": _route,
}


def records(n: int, seed: int = 0, start: float = 1_750_000_000.0, rate_per_s: float = 50.0,
            compact_lists: bool = True) -> Iterator[dict[str, Any]]:
    """``n`` observation records in publication order (see the module docstring).

    With ``compact_lists`` a list argument is recorded as its argument features only
    (as a worker does for large arguments), keeping the records small.
    """
    from celery_aitp.predict.features import argument_features

    rng = random.Random(seed)  # noqa: S311 - a reproducible workload, not security
    now = start
    tasks = list(TASKS.items())
    tenants = list(TENANTS.items())
    for _ in range(n):
        now += rng.expovariate(rate_per_s)
        task, make = rng.choice(tasks)
        tenant, factor = rng.choice(tenants)
        args, kwargs, base = make(rng)
        runtime = base * factor * math.exp(rng.gauss(0.0, NOISE_SIGMA))
        share, slower = COLD_CACHE.get(task, (0.0, 1.0))
        if rng.random() < share:
            runtime *= slower
        record: dict[str, Any] = {
            "task": task, "tenant": tenant, "task_id": str(uuid.UUID(int=rng.getrandbits(128))),
            "args": args, "kwargs": kwargs, "published_at": round(now, 6),
            "runtime_s": round(runtime, 6), "outcome": "SUCCESS",
        }
        if compact_lists and any(isinstance(a, list) for a in args):
            features = argument_features(args, kwargs, len(repr(tuple(args))[:1024]),
                                         len(repr(kwargs)))
            record["features"] = {k: (None if v != v else v) for k, v in features.items()}
            record["args"] = [a if not isinstance(a, list) else {"_summarised": len(a)}
                              for a in args]
        yield record
