"""The learning loop on real Redis: a worker records runs, train promotes a model, and a
running producer and the worker's pool process switch to it within seconds."""

from __future__ import annotations

import random
import time
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from celery_aitp.cli.celery_command import aitp
from celery_aitp.learn.observations import stream_length
from celery_aitp.predict.features import argument_features, call_signature
from celery_aitp.predict.history import HistoryStore
from celery_aitp.predict.model_source import MODEL_SOURCE
from celery_aitp.predict.model_store import ModelStore
from tests.support.live import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]
HEADERS = {"aitp_tenant": "acme"}


def test_runs_are_recorded_a_model_is_promoted_and_picked_up(proj, start_worker):
    mw = proj.app.aitp
    start_worker("acme", "--aitp-tenant", "acme", "--aitp-accelerator", "cpu", concurrency=2)
    wait_for(lambda: "aitp.acme.cpu.lo" in mw.store.live_queues(), 15, "the advertisement")
    mw.live.refresh()
    rng = random.Random(7)
    sleeps = [rng.randrange(0, 60, 3) for _ in range(160)]
    results = [proj.nap.apply_async((ms,), headers=HEADERS) for ms in sleeps]
    assert [r.get(timeout=60) for r in results] == sleeps
    wait_for(lambda: stream_length(mw.store) >= len(sleeps), 10, "the observations")

    record = mw.store.read_records(mw.store.keys.observations)[-1]
    assert record["task"] == proj.nap.name and record["tenant"] == "acme"
    assert record["queue"] == "aitp.acme.cpu.lo" and record["tier"] == "lo"
    assert record["worker_accelerator"] == "cpu" and record["outcome"] == "SUCCESS"
    assert record["features"]["arg0"] == record["args"][0]
    assert record["runtime_s"] >= record["args"][0] / 1000 and record["cpu_s"] >= 0
    assert record["wait_s"] is not None and record["peak_rss_mb"] > 0

    # cold start: the worker's history summary reaches the producer
    def cold_prediction():
        mw.live.refresh()
        view = mw.live.current()
        return view.sources["aitp.history"].estimates.get(("acme", proj.nap.name))
    wait_for(cold_prediction, 10, "the history summary")

    # ... with the runs per magnitude of the argument: the shortest naps (0 ms, 9-15 ms)
    # get their own size, below the task's longest
    def short_naps_sized_apart():
        mw.live.refresh()
        history = mw.live.current().sources["aitp.history"]
        found = [history.of_class(proj.nap.name, [ms], {}) for ms in (0, 9)]
        return [estimate for estimate in found if estimate is not None]
    sized = wait_for(short_naps_sized_apart, 10, "the magnitude classes")
    task_bound = mw.live.current().sources["aitp.history"].bounds[proj.nap.name][0]
    assert all(bound <= task_bound / 2 for _, bound in sized)

    # ... and per call (the naps of one length), every run counted, for the cold start
    signature = call_signature(argument_features([sleeps[0]], {}))
    wait_for(lambda: HistoryStore(mw.store).read_calls().get((proj.nap.name, signature),
                                                             (0,))[0]
             == sleeps.count(sleeps[0]), 10, "the runs of one call")

    def call_sized():
        mw.live.refresh()
        return mw.live.current().sources["aitp.history"].of_call(proj.nap.name,
                                                                 [sleeps[0]], {})
    p50, p90 = wait_for(call_sized, 10, "the call's own estimate")
    assert p90 >= p50 >= sleeps[0] / 1000

    result = CliRunner().invoke(aitp, ["train", "--min-records", "50"],
                                obj=SimpleNamespace(app=proj.app), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "promoted" in result.output and "not promoted" not in result.output
    version = ModelStore(mw.store).version()

    promoted_at = time.monotonic()
    wait_for(lambda: getattr(mw.live.current().sources[MODEL_SOURCE], "version", None)
             == version, 10, "the producer to load the model")
    picked_up_s = time.monotonic() - promoted_at
    assert picked_up_s < 5  # the refresher runs every 0.5 s in the test app

    outcome = proj.where.apply_async((1,), headers=HEADERS).get(timeout=20)
    assert outcome["aitp"]["prediction_source"] == "model"
    assert wait_for(lambda: proj.model_version.apply_async(headers=HEADERS).get(timeout=10)
                    == version, 10, "the worker to load the model")
