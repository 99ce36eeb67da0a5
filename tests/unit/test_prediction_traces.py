"""The real-trace benchmark's leak probe and scoring (benchmarks/prediction_traces.py)."""

from __future__ import annotations

from benchmarks.prediction_traces import leak_probe, score
from celery_aitp.learn.dataset import build_dataset
from celery_aitp.predict.features import history_features

RUNS = [  # (published_at, runtime_s): one tenant, one task
    (0.0, 100.0), (10.0, 5.0), (20.0, 7.0), (30.0, 9.0), (200.0, 1.0), (210.0, 2.0),
]


def dataset() -> list:
    records = [{"task": "job", "tenant": "user1", "published_at": p, "runtime_s": r}
               for p, r in RUNS]
    return build_dataset(records).observations


def test_the_probe_accepts_histories_of_finished_runs_only():
    observations = dataset()
    assert leak_probe(observations, observations) == (len(RUNS), len(RUNS))


def test_the_probe_catches_a_run_counted_before_it_finished():
    observations = dataset()
    # at t=20 runs 0 (ends 100) and 2 are unfinished; only run 1 (ends 15) may count
    leaked = observations[2]
    assert leaked.history is not None and leaked.history[0] == 5.0
    leaked.history = history_features([7.0, 5.0], 2, [7.0, 5.0])  # run 2 leaked in
    matching, probed = leak_probe(observations, observations)
    assert probed == len(RUNS) and matching == len(RUNS) - 1


def test_scores():
    s = score("x", [10.0, 10.0, 10.0, 10.0], [10.0, 25.0, 4.0, 19.0], [11.0, 9.0, 20.0, 10.0])
    assert s.mae == (0 + 15 + 6 + 9) / 4 and s.median_ae == 7.5
    assert s.within_2x == 0.5 and s.p90_coverage == 0.75
