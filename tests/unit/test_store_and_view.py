"""The store's liveness and stage records, and the cached view the publish path reads."""

from __future__ import annotations

import time

from celery_aitp.core.view import stage_from_doc
from celery_aitp.policy import Policy, Stage
from celery_aitp.publish.live_view import LiveView
from celery_aitp.store import Keys, RedisStore, connect
from celery_aitp.telemetry.counters import Counters


def test_advertised_queues_are_live_until_they_expire(store):
    store.advertise("w1", ["aitp.a.cpu.hi", "aitp.a.cpu.lo"], {"tenants": ["a"]}, ttl_s=60)
    store.advertise("w2", ["aitp.b.cpu.hi"], {}, ttl_s=-1)  # already expired
    assert store.live_queues() == {"aitp.a.cpu.hi", "aitp.a.cpu.lo"}
    workers = store.workers()
    assert [w["worker"] for w in workers] == ["w1", "w2"]
    assert workers[0]["queues"] == ["aitp.a.cpu.hi", "aitp.a.cpu.lo"]


def test_withdraw_removes_a_worker_at_once(store):
    store.advertise("w1", ["q1"], {}, ttl_s=60)
    store.advertise("w2", ["q1", "q2"], {}, ttl_s=60)
    store.withdraw("w2")
    assert store.live_queues() == {"q1"}
    assert [w["worker"] for w in store.workers()] == ["w1"]


def test_expired_advertisements_are_pruned_so_nothing_grows(store):
    for i in range(50):
        store.advertise(f"w{i}", [f"q{i}"], {}, ttl_s=-1)
    store.advertise("last", ["q"], {}, ttl_s=60)
    assert store.client.zcard(store.keys.consumers) == 1


class _SkewedClock:
    """Stands in for the ``time`` module of the store: this process's clock ``offset_s``
    seconds off the Redis server's (fakeredis answers TIME from the real clock)."""

    def __init__(self, offset_s: float) -> None:
        self.offset_s = offset_s

    def time(self) -> float:
        return time.time() + self.offset_s

    def monotonic(self) -> float:
        return time.monotonic()


def _skew(monkeypatch, offset_s: float) -> None:
    from celery_aitp.store import redis_store

    monkeypatch.setattr(redis_store, "time", _SkewedClock(offset_s))


def test_a_producer_ahead_of_the_workers_still_sees_their_advertisements(store, monkeypatch):
    """A producer 15 s ahead saw every 3 s advertisement as expired (0 of 46 routed)."""
    store.advertise("w1", ["q1"], {}, ttl_s=3)
    _skew(monkeypatch, 15.0)
    assert store.live_queues() == {"q1"}
    assert store.snapshot()[0] == {"q1"}  # what the refresher reads
    view = LiveView(store, Policy(), Counters(), refresh_interval_s=60)
    assert view.current().live_queues == {"q1"}
    view.close()
    _skew(monkeypatch, -15.0)  # and one behind sees an expired one as expired
    store.advertise("w2", ["q2"], {}, ttl_s=-1)
    assert store.live_queues() == {"q1"}


def test_a_worker_ahead_neither_prunes_others_nor_outlives_its_ttl(store, monkeypatch):
    """A worker 60 s ahead deleted every other worker's advertisement as it advertised,
    and its own lasted 60 s past its TTL."""
    store.advertise("w1", ["q1"], {}, ttl_s=3)
    _skew(monkeypatch, 60.0)
    store.advertise("w2", ["q2"], {}, ttl_s=3)
    monkeypatch.undo()
    assert store.live_queues() == {"q1", "q2"}
    expiry = store.client.zscore(store.keys.consumers, "q2|w2")
    assert expiry <= time.time() + 3.5  # the server's time + ttl, not the worker's
    (w1, w2) = store.workers()
    assert abs(w2["heartbeat"] - time.time()) < 1  # the server's time too
    now, _ = store.workers_at()
    assert abs(now - time.time()) < 1


def test_advertisements_keep_their_stored_format(store):
    """The dashboard, janitor and status read these keys: the members and scores of the
    consumers zset and the worker documents stay as they were."""
    before = time.time()
    store.advertise("w1", ["q1", "q1", "q2"], {"tenants": ["a"], "heartbeat": "x"}, ttl_s=30)
    scored = dict(store.client.zrange(store.keys.consumers, 0, -1, withscores=True))
    assert set(scored) == {b"q1|w1", b"q2|w1"}
    assert all(before + 29 < s < time.time() + 31 for s in scored.values())
    import json

    doc = json.loads(store.client.hget(store.keys.workers, "w1"))
    assert doc["worker"] == "w1" and doc["queues"] == ["q1", "q2"]
    assert doc["tenants"] == ["a"] and isinstance(doc["heartbeat"], float)
    assert before - 1 < doc["heartbeat"] < time.time() + 1
    store.advertise("w1", ["q2"], {}, ttl_s=30)  # q1 left out: withdrawn at once
    assert store.live_queues() == {"q2"}
    store.advertise("w1", [], {}, ttl_s=30)
    assert store.live_queues() == frozenset()
    assert json.loads(store.client.hget(store.keys.workers, "w1"))["queues"] == []


def test_stage_changes_are_audited(store):
    assert store.read_stage() is None
    store.write_stage({"stage": "split", "split": {"percent": 10}}, who="alice@host")
    store.write_stage({"stage": "takeover", "split": {}}, who="bob@host")
    history = store.stage_history()
    assert [h["who"] for h in history] == ["bob@host", "alice@host"]
    assert history[0]["old"]["stage"] == "split" and history[0]["new"]["stage"] == "takeover"


def test_malformed_stage_document_falls_back_to_policy():
    policy = Policy(stage=Stage.SPLIT)
    assert stage_from_doc({"stage": "warp-speed"}, policy)[0] is Stage.SPLIT
    assert stage_from_doc({"stage": "takeover", "split": {"percent": 500}}, policy)[0] \
        is Stage.SPLIT
    assert stage_from_doc(None, policy)[0] is Stage.SPLIT


def test_counters_are_shipped_and_survive_a_store_outage(store):
    counters = Counters()
    view = LiveView(store, Policy(), counters)
    counters.incr("x", 3)
    view.flush()
    assert store.counts() == {"x": 3}
    dead = LiveView(RedisStore(connect("redis://127.0.0.1:1/0", 0.1), Keys("d")), Policy(),
                    counters)
    counters.incr("x", 2)
    dead.flush()
    assert counters.totals["x"] == 5  # counted once, shipped or put back
    view.flush()
    assert store.counts() == {"x": 5}
    assert counters.totals["x"] == 5


def test_counts_put_back_merge_with_counts_made_meanwhile() -> None:
    counters = Counters()
    counters.incr("a")
    counters.incr("a", 2)
    counters.incr("b")
    shipped = counters.drain()
    assert shipped == {"a": 3, "b": 1}
    assert counters.drain() == {}  # drained once
    counters.incr("a")  # counted while the failed shipment was in flight
    counters.restore(shipped)
    assert counters.totals == {"a": 4, "b": 1}  # put back, not counted twice
    assert counters.drain() == {"a": 4, "b": 1}
    assert counters.totals == {"a": 4, "b": 1}


def test_tallies_count_with_the_same_name_and_drain_once() -> None:
    counters = Counters()
    tally = counters.tally("reused")
    assert counters.tally("reused") is tally  # one tally per name
    for _ in range(3):
        tally.append(None)
    counters.incr("reused", 2)  # the locked counter of the same name adds up with it
    assert counters.totals == {"reused": 5}
    assert counters.drain() == {"reused": 5}
    assert counters.drain() == {}  # a tally is emptied by the drain that shipped it
    tally.append(None)
    assert counters.totals == {"reused": 6}


class _CountedWhileDrained(list[None]):
    """A tally to which another thread appends once, just after drain reads its length."""

    once = True

    def __len__(self) -> int:
        n = super().__len__()
        if self.once:
            self.once = False
            self.append(None)
        return n


def test_an_event_tallied_while_draining_is_shipped_by_the_next_drain() -> None:
    counters = Counters()
    counters._tallies["t"] = marks = _CountedWhileDrained([None, None])
    assert counters.drain() == {"t": 2}
    assert list(marks) == [None]  # kept for the next drain, not cleared with the rest
    assert counters.drain() == {"t": 1}
    assert counters.totals == {"t": 3}


def test_records_are_kept_for_the_next_round_when_the_store_fails(store):
    counters = Counters()
    dead = LiveView(RedisStore(connect("redis://127.0.0.1:1/0", 0.1), Keys("d")), Policy(),
                    counters)
    dead.buffer("s").add({"n": 1})
    counters.incr("y")
    dead.flush()
    assert len(dead.buffer("s")) == 1


def test_view_goes_stale_when_refreshes_stop(store):
    view = LiveView(store, Policy(), Counters(), refresh_interval_s=60, max_staleness_s=0.05)
    store.advertise("w", ["q"], {}, ttl_s=60)
    assert view.current().fresh and "q" in view.current().live_queues
    time.sleep(0.1)
    assert not view.current().fresh
    assert view.current() is view.current()  # one stale twin per snapshot (the memo keeps it)
    view.close()


def test_buffer_drops_oldest_and_counts_when_full():
    from celery_aitp.telemetry.buffer import RecordBuffer

    counters = Counters()
    buf = RecordBuffer("s", counters, capacity=3)
    for i in range(5):
        buf.add({"i": i})
    assert [r["i"] for r in buf.take()] == [2, 3, 4]
    assert counters.totals["records_dropped:s"] == 2


class _CountingSource:
    """A source that counts its fetches and can be told to fail."""

    name = "counting"
    initial = 0

    def __init__(self) -> None:
        self.fail = False

    def fetch(self, store, previous):
        if self.fail:
            raise RuntimeError("boom")
        return previous + 1


def test_sources_are_fetched_each_round_and_keep_their_value_when_they_fail(store):
    counters = Counters()
    view = LiveView(store, Policy(), counters, refresh_interval_s=60)
    source = _CountingSource()
    view.add_source(source)
    assert view._view.sources["counting"] == 0
    view.refresh()
    view.refresh()
    assert view._view.sources["counting"] == 2
    source.fail = True
    view.refresh()
    assert view._view.sources["counting"] == 2
    assert counters.totals["source_errors:counting"] == 1


def test_a_source_name_is_registered_once(store):
    view = LiveView(store, Policy(), Counters())
    view.add_source(_CountingSource())
    try:
        view.add_source(_CountingSource())
    except ValueError as exc:
        assert "counting" in str(exc)
    else:
        raise AssertionError("a second source of the same name was accepted")


def test_status_marks_workers_gone_past_their_ttl(app, store):
    """A SIGKILLed worker's document stays in the store for an hour: `aitp status` listed
    it among the live workers, unmarked, all that time."""
    import json
    from types import SimpleNamespace

    from click.testing import CliRunner

    from celery_aitp.cli.celery_command import aitp

    store.advertise("alive@h", ["aitp.acme.cpu.hi"], {"tenants": ["acme"]}, ttl_s=60)
    killed = {"worker": "killed@h", "tenants": ["acme"], "queues": [],
              "heartbeat": time.time() - 600}  # as the advertisement left it 10 min ago
    store.client.hset(store.keys.workers, "killed@h", json.dumps(killed))
    ctx = SimpleNamespace(app=app)
    out = CliRunner().invoke(aitp, ["status"], obj=ctx, terminal_width=200)
    assert out.exit_code == 0, out.output
    assert "1 live, 1 gone" in out.output
    rows = {line.split()[1]: line for line in out.output.splitlines()
            if "@h" in line}
    assert "live" in rows["alive@h"] and "GONE" in rows["killed@h"]
    assert out.output.index("alive@h") < out.output.index("killed@h")
    data = json.loads(CliRunner().invoke(aitp, ["status", "--json"], obj=ctx).output)
    assert [(w["worker"], w["alive"]) for w in data["workers"]] == \
        [("alive@h", True), ("killed@h", False)]
    assert 599 < data["workers"][1]["heartbeat_age_s"] < 700
