"""Hostile observation records: what workers record, and what train/replay/predict read.

Properties: the worker's observer never raises and always buffers a strict-JSON record
whose header-derived fields are checked (each rejected field counted); every record a
reader is handed is either used or skipped and counted by reason (the counts add up);
no file content (invalid UTF-8, deep nesting, truncation, gzip garbage) raises.
"""

from __future__ import annotations

import gzip
import io
import json
import math
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import fakeredis
import pytest
from celery import Celery
from hypothesis import given
from hypothesis import strategies as st

import celery_aitp
from celery_aitp.learn.dataset import Unreadable, build_dataset, read_jsonl
from celery_aitp.learn.observations import store_records
from celery_aitp.predict.features import FeatureSpec
from celery_aitp.predict.history import HistoryStore
from celery_aitp.replay.trace import load_jsonl
from celery_aitp.store import Keys, RedisStore
from celery_aitp.worker.observe import Observer
from tests.unit.hostile import (
    HOSTILE,
    deep_json_text,
    json_texts,
    json_values,
    odd_bytes,
    odd_floats,
    odd_text,
    py_values,
    utf8,
)

POLICY = {"tenants": {"acme": {}, "default": {}}, "stage": "takeover"}
TIERS = ("hi", "mid", "lo")


@pytest.fixture(scope="module")
def worker_app() -> Iterator[Celery]:
    app = Celery("hostile-worker", broker="memory://", backend="cache+memory://")
    mw = celery_aitp.install(app, policy=POLICY,
                             store=RedisStore(fakeredis.FakeRedis(), Keys("hostile-worker")))
    mw.live.current()
    yield app
    mw.close()


header_values = st.one_of(
    st.fixed_dictionaries({}, optional={
        "tenant": st.one_of(st.sampled_from(["acme", "default", "evil", "a|b"]), py_values),
        "tier": st.one_of(st.sampled_from(TIERS), py_values),
        "decided_at": st.one_of(odd_floats, py_values),
        "predicted_runtime_s": odd_floats, "predicted_p90_s": py_values,
        "routed": py_values, "queue": st.one_of(odd_text, py_values),
        "reason": odd_text, "arm": py_values, "stage": py_values}),
    py_values)
requests = st.builds(
    SimpleNamespace, aitp=header_values, argsrepr=st.one_of(odd_text, py_values),
    kwargsrepr=py_values, delivery_info=st.one_of(
        st.fixed_dictionaries({"routing_key": st.one_of(odd_text, py_values)}), py_values),
    eta=st.one_of(st.none(), odd_text, py_values, st.just("9999-12-31T23:59:59+14:00"),
                  st.just("0001-01-01T00:00:00")),
    hostname=py_values, retries=py_values)


@HOSTILE
@given(req=requests, declared=st.one_of(
           st.fixed_dictionaries({"runtime_hint_s": st.one_of(odd_floats, py_values)}),
           py_values),
       args=py_values, kwargs=st.one_of(st.dictionaries(odd_text, py_values, max_size=4),
                                        py_values),
       state=st.one_of(st.sampled_from(["SUCCESS", "FAILURE"]), py_values))
def test_the_worker_records_any_run_with_checked_fields(worker_app, req, declared, args,
                                                      kwargs, state):
    mw = worker_app.aitp
    observer = Observer(worker_app)
    task = SimpleNamespace(app=worker_app, name="h.task", request=req, aitp=declared)
    buffer = mw.live.buffer(mw.store.keys.observations)
    buffer.take(10**6)
    failed = mw.counters.totals["observations_failed"]
    observer.prerun(task_id="t1", task=task)
    observer.postrun(task_id="t1", task=task, state=state, args=args, kwargs=kwargs)
    assert mw.counters.totals["observations_failed"] == failed  # never lost
    (record,) = buffer.take(10)
    json.dumps(record, allow_nan=False)  # strict JSON: no NaN/inf, no objects
    assert record["tenant"] in (None, "acme", "default")
    assert record["routed"] in (None, True, False)
    assert math.isfinite(record["published_at"]) and math.isfinite(record["started_at"])
    assert record["wait_s"] is None or math.isfinite(record["wait_s"])
    assert type(record["retries"]) is int and isinstance(record["worker"], str)
    header = req.aitp if type(req.aitp) is dict else {}
    forged = header.get("tenant")
    if forged is not None and not (type(forged) is str and forged in ("acme", "default")):
        assert mw.counters.totals["rejected:aitp_header:tenant"] >= 1
    buffer.add(record)
    mw.live.flush()  # the record, ledger and history go to the store without error
    assert {t for t, _ in HistoryStore(mw.store).read()} <= {"acme", "default"}


record_values = st.fixed_dictionaries(
    {"task": st.one_of(st.just("t.a"), json_values),
     "tenant": st.one_of(st.just("acme"), json_values),
     "published_at": st.one_of(st.floats(1e9, 2e9), odd_floats, json_values),
     "runtime_s": st.one_of(st.floats(0, 100), odd_floats, json_values)},
    optional={"args": json_values, "kwargs": json_values, "features": json_values,
              "started_at": odd_floats, "wait_s": odd_floats, "retries": json_values,
              "runtime_hint_s": json_values, "outcome": json_values,
              "args_bytes": json_values, "kwargs_bytes": json_values})
records = st.lists(st.one_of(record_values, json_values, st.builds(Unreadable, odd_text)),
                   max_size=12)


@HOSTILE
@given(records=records)
def test_every_record_is_used_or_skipped_and_counted(records):
    dataset = build_dataset(records)
    assert len(dataset) + sum(dataset.skipped.values()) == dataset.total == len(records)
    if dataset.skipped:
        assert "skipped" in dataset.summary()
    spec = FeatureSpec(dataset.kwarg_names(), dataset.vocabulary("task"),
                       dataset.vocabulary("tenant"))
    for obs in dataset.observations:
        assert math.isfinite(obs.published_at) and obs.runtime_s is not None
        assert math.isfinite(obs.runtime_s) and obs.runtime_s >= 0
        row = spec.row(obs.task, obs.tenant, obs.arguments, obs.hint_s, obs.retries,
                       obs.published_at, obs.history)
        assert all(type(v) is float for v in row) and len(row) == len(spec.names)
        assert all(v != v or abs(v) < 1e300 for v in row)


lines = st.lists(st.one_of(json_texts.map(utf8), odd_bytes,
                           record_values.map(lambda r: utf8(json.dumps(r)))), max_size=8)


def _write(path: Path, content: list[bytes], compress: bool = False) -> None:
    data = b"\n".join(content) + b"\n"
    path.write_bytes(gzip.compress(data) if compress else data)


def _nonblank(content: list[bytes]) -> int:
    """Lines a text reader sees (universal newlines, str.strip) that are not blank."""
    text = (b"\n".join(content) + b"\n").decode("utf-8", "replace")
    return sum(1 for line in io.StringIO(text, newline=None) if line.strip())


@HOSTILE
@given(content=lines)
def test_any_json_lines_file_reads_without_raising(tmp_path_factory, content):
    path = tmp_path_factory.mktemp("jsonl") / "runs.jsonl"
    _write(path, content)
    got = list(read_jsonl(path))
    assert len(got) == _nonblank(content)  # one record or skip marker per non-blank line
    dataset = build_dataset(got)
    assert len(dataset) + sum(dataset.skipped.values()) == len(got)
    trace = load_jsonl(path)  # the replay's reader of the same format
    assert len(trace) + sum(trace.skipped.values()) == _nonblank(content)


@HOSTILE
@given(content=lines, cut=st.integers(0, 200))
def test_a_damaged_gzip_trace_is_reported_not_raised(tmp_path_factory, content, cut):
    path = tmp_path_factory.mktemp("gz") / "runs.jsonl.gz"
    _write(path, content, compress=True)
    data = path.read_bytes()
    path.write_bytes(data[: max(0, len(data) - cut)])
    try:
        trace = load_jsonl(path)
    except OSError as exc:  # not a gzip file at all: the CLI says so ("cannot read trace")
        assert "gzip" in str(exc).lower() or "not" in str(exc).lower()
        return
    if cut:
        assert trace.skipped.get("truncated file", 0) <= 1
    assert len(trace) <= _nonblank(content)


def test_deeply_nested_json_lines_are_skipped_as_not_json(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_text(deep_json_text(100_000) + "\n" + json.dumps({"task": "t"}) + "\n")
    got = list(read_jsonl(path))
    assert isinstance(got[0], Unreadable) and got[0].reason == "not JSON"
    assert load_jsonl(path).skipped["not JSON"] == 1


@HOSTILE
@given(entries=st.lists(st.one_of(json_texts.map(utf8), odd_bytes), max_size=6))
def test_hostile_entries_in_the_observation_stream_are_skip_markers(entries):
    store = RedisStore(fakeredis.FakeRedis(), Keys("hostile-obs"))
    for raw in entries:
        store.client.xadd(store.keys.observations, {"r": raw})
    store.client.xadd(store.keys.observations, {"other": b"x"})
    got = list(store_records(store))
    assert len(got) == len(entries) + 1
    assert all(isinstance(r, (dict, Unreadable)) for r in got)
    assert all(isinstance(r, dict) for r in store.read_records(store.keys.observations))


def test_a_forged_header_field_is_named_in_the_log(worker_app, caplog):
    observer = Observer(worker_app)
    request = SimpleNamespace(aitp={"tenant": "evil", "decided_at": float("nan")},
                              delivery_info={}, hostname="w", retries=0)
    task = SimpleNamespace(app=worker_app, name="h.task", request=request, aitp={})
    with caplog.at_level("WARNING", logger="celery_aitp.worker.observe"):
        observer.prerun(task_id="t2", task=task)
        observer.postrun(task_id="t2", task=task, state="SUCCESS", args=[], kwargs={})
    assert "'tenant'" in caplog.text and "rejected:aitp_header:tenant" in caplog.text
    assert "'decided_at'" in caplog.text


def test_finite_number_never_raises_and_keeps_only_finite_numbers():
    from celery_aitp.numbers import finite_number

    assert finite_number(3) == 3.0 and finite_number(-2.5) == -2.5
    for odd in (None, True, "1", float("nan"), float("inf"), -float("inf"), 10 ** 400, [1]):
        assert finite_number(odd) is None, odd
