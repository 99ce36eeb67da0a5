"""The run observer: one record per run with the documented fields; never fails a task."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from celery_aitp.predict.history import HistoryStore
from celery_aitp.store import Keys, RedisStore, connect
from celery_aitp.telemetry.buffer import RecordBuffer

PREDICTION_DOCS = Path(__file__).resolve().parents[2] / "docs" / "prediction.md"
HEADER = {"v": 1, "tenant": "acme", "tier": "hi", "accelerator": "cpu", "routed": True,
          "queue": "aitp.acme.cpu.hi", "reason": "routed", "stage": "takeover",
          "decided_at": 1_700_000_000.0, "predicted_runtime_s": 0.5, "predicted_p90_s": 1.0,
          "prediction_source": "model"}


def records(app):
    app.aitp.live.flush()
    return app.aitp.store.read_records(app.aitp.store.keys.observations)


@pytest.mark.parametrize("wire", [json.dumps, dict], ids=["v2 text", "v1 mapping"])
def test_a_run_is_recorded_with_the_documented_fields(app, wire):
    app.aitp.live.current()
    task = app.tasks["tests.unit.conftest.urgent"]
    assert task.apply(([1, 2, 3],), headers={"aitp": wire(HEADER)}).get() == [1, 2, 3]
    (record,) = records(app)
    documented = re.findall(r"^\| `(\w+)` \|", PREDICTION_DOCS.read_text().split(
        "## Observation records")[1].split("\n## ")[0], re.M)
    assert set(record) == set(documented), set(record) ^ set(documented)
    assert record["task"] == task.name and record["tenant"] == "acme" and record["tier"] == "hi"
    assert record["published_at"] == HEADER["decided_at"] and record["outcome"] == "SUCCESS"
    assert record["runtime_s"] >= 0 and record["cpu_s"] >= 0 and record["peak_rss_mb"] > 0
    assert record["features"]["arg0"] == 3 and record["features"]["n_args"] == 1
    assert record["args"] == [[1, 2, 3]] and record["prediction_source"] == "model"
    app.aitp.live.flush()
    assert HistoryStore(app.aitp.store).read()[("acme", task.name)][0] == 1


def test_a_run_decided_on_a_clock_ahead_is_counted_as_clock_skew(app, caplog):
    """A producer 15 s ahead of the worker gives its runs a wait of about -15 s: counted
    (and logged once) so an operator sees it; the record keeps the wait as it came."""
    import time

    app.aitp.live.current()
    task = app.tasks["tests.unit.conftest.urgent"]
    for ahead in (15.0, 15.0, 0.5):  # the last within the tolerance: synced clocks
        task.apply((1,), headers={"aitp": {**HEADER, "decided_at": time.time() + ahead}})
    waits = [r["wait_s"] for r in records(app)]
    assert waits[0] < -14 and waits[1] < -14 and -1 < waits[2] <= 0
    assert app.aitp.store.counts().get("clock_skew") == 2
    assert sum("clocks of its producer and this worker differ" in r.getMessage()
               for r in caplog.records) == 1


def _echo(x: object) -> object:
    return x


def test_a_tier_run_longer_than_the_visibility_timeout_is_counted_and_said(store, caplog):
    """A strict worker acknowledges a tier delivery after the run: one longer than Redis's
    visibility_timeout may have run twice, and a task with no history had no prediction
    for the producers' guard to flag it by."""
    from celery import Celery

    import celery_aitp
    from tests.conftest import TEST_POLICY

    app = Celery("visibility", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.broker_transport_options = {"visibility_timeout": 1e-9}  # any run outlasts it
    celery_aitp.install(app, policy=TEST_POLICY, store=store)
    task = app.task(name="vis.urgent", shared=False)(_echo)
    app.aitp.live.current()
    for _ in range(2):
        task.apply((1,), headers={"aitp": HEADER}, routing_key="aitp.acme.cpu.hi")
    task.apply((1,), headers={"aitp": HEADER}, routing_key="default-q")  # acked at start
    records(app)
    assert app.aitp.store.counts().get("visibility_exceeded") == 2
    assert sum("longer than the Redis visibility_timeout" in r.getMessage()
               for r in caplog.records) == 1


def test_a_failed_run_is_recorded_and_not_added_to_the_history(app):
    app.aitp.live.current()

    @app.task(shared=False)
    def boom() -> None:
        raise ValueError("no")

    result = boom.apply(headers={"aitp": HEADER})
    assert result.failed()
    (record,) = records(app)
    assert record["outcome"] == "FAILURE"
    assert HistoryStore(app.aitp.store).read() == {}


def test_runs_without_an_aitp_header_are_recorded_too(app):
    app.aitp.live.current()
    app.tasks["tests.unit.conftest.plain"].apply((7,)).get()
    (record,) = records(app)
    assert record["tenant"] is None and record["published_at"] == record["started_at"]


def test_when_the_store_is_down_records_are_dropped_and_counted(app):
    mw = app.aitp
    mw.live.current()
    down = RedisStore(connect("redis://127.0.0.1:1/0", 0.05), Keys("unit"))
    mw.live.store = down
    stream = mw.store.keys.observations
    mw.live.buffers[stream] = RecordBuffer(stream, mw.counters, capacity=3)
    task = app.tasks["tests.unit.conftest.plain"]
    for i in range(5):
        assert task.apply((i,), headers={"aitp": HEADER}).get() == i  # tasks unaffected
    mw.live.flush()
    assert mw.counters.totals[f"records_dropped:{stream}"] == 2
    assert len(mw.live.buffers[stream]) == 3


def test_a_recording_error_is_counted_and_the_task_still_succeeds(app, monkeypatch):
    app.aitp.live.current()
    observer = app._aitp_observer

    def broken(*args, **kwargs):
        raise RuntimeError("recording bug")

    monkeypatch.setattr(observer, "_record", broken)
    assert app.tasks["tests.unit.conftest.plain"].apply((1,)).get() == 1
    assert app.aitp.counters.totals["observations_failed"] == 1


@pytest.mark.parametrize("value", [object(), float("nan"), {"deep": [[[[1]]]]}, b"\0" * 5000])
def test_any_argument_is_recorded_safely(app, value):
    app.aitp.live.current()
    app.tasks["tests.unit.conftest.plain"].apply((value,)).get()
    (record,) = records(app)
    assert record["features"]["n_args"] == 1


def test_header_numbers_out_of_range_are_rejected_without_raising():
    from celery_aitp.worker.observe import checked_header

    for odd in (10 ** 400, -10 ** 400, float("nan"), float("inf"), True, "1.0"):
        kept, bad = checked_header({"decided_at": odd, "tenant": "acme"}, {"acme"})
        assert kept == {"tenant": "acme"} and bad == ["decided_at"], odd
    assert checked_header({"decided_at": 12.5}, {"acme"}) == ({"decided_at": 12.5}, [])


def test_a_header_without_a_tenant_is_not_a_rejected_one():
    """A misconfigured producer's header (config_error) names no tenant: nothing forged."""
    from celery_aitp.worker.observe import checked_header

    assert checked_header({"tenant": "", "reason": "config_error"}, {"acme"}) == (
        {"reason": "config_error"}, [])
    assert checked_header({"tenant": "ghost"}, {"acme"}) == ({}, ["tenant"])
