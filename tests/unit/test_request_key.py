"""The cache key built straight from a task's arguments equals binning its feature vector."""

from __future__ import annotations

import math
import random

from celery_aitp.predict.bundle import load_bundle
from celery_aitp.predict.compiled import on_grid
from celery_aitp.predict.features import history_features

ODD = [None, True, False, 0, -0.0, 1e-36, -1e-36, math.nan, math.inf, -math.inf, 10**400,
       "", "text" * 50, b"xy", [1, 2, 3], (), {"a": 1}, {4, 5}, object(), 3.5, -7, 2**70]


def test_the_request_key_equals_the_key_of_the_vector(trained):
    model = load_bundle(trained.bundle)
    assert model.request_key is not None
    spec, compiled = model.spec, model.compiled
    rng = random.Random(4)
    tasks = [*spec.tasks, "never.seen"]
    tenants = [*spec.tenants, "nobody"]
    names = [*spec.kwarg_names, "other"]
    for i in range(3000):
        def value():
            return rng.choice(ODD) if rng.random() < 0.3 else rng.choice(
                [rng.randint(0, 5000), rng.uniform(-10, 10_000), rng.randint(0, 3)])
        args = tuple(value() for _ in range(rng.randint(0, 5)))
        kwargs = {n: value() for n in names if rng.random() < 0.5}
        inputs = (
            rng.choice(tasks), rng.choice(tenants),
            args if i % 17 else list(args) if i % 2 else "not args",
            kwargs if i % 19 else ["not", "kwargs"],
            rng.choice([rng.randint(0, 1024), None, math.nan, 3.5]),
            rng.choice([rng.randint(0, 1024), None, "x"]),
            rng.choice([None, 0.5, 30, "slow", math.nan]),
            rng.choice([0, 1, 7, None, 2.0]),
            rng.choice([1.7e9 + rng.uniform(0, 1e7), 1_700_000_000, None, -5.0, math.nan]),
            rng.choice([None, history_features([0.5, 2.0, 1.25], 12, [3.0]),
                            history_features([], 0, [7.0]), history_features([], 0)]),
        )
        assert model.request_key(*inputs) == compiled.key(spec.vector(*inputs)), inputs


def test_a_miss_from_the_key_predicts_what_the_vector_walk_gives(trained):
    model = load_bundle(trained.bundle)
    spec, compiled = model.spec, model.compiled
    for task in spec.tasks:
        for size in (1, 50, 900, 20_000):
            inputs = (task, next(iter(spec.tenants)), (size, size // 3), {"rows": size},
                      9, 12, None, 0, 1.7e9, history_features([0.4, 0.9, 1.4], 30))
            compiled.cache.clear()
            got = compiled.predict_key(model.request_key(*inputs))
            want = tuple(on_grid(v) for v in compiled.evaluate(spec.vector(*inputs)))
            assert got[:2] == want and not got[2]
