"""``celery aitp explain``: the indexed decision log and the breakdown it prints."""

from __future__ import annotations

import json

from click.testing import CliRunner

from celery_aitp.cli.celery_command import aitp
from celery_aitp.cli.explain import _size_rule
from celery_aitp.explain import explain, policy_for, tier_story
from celery_aitp.policy import Policy, parse_policy
from celery_aitp.policy_history import policy_digest
from celery_aitp.store.decision_log import DecisionLog
from tests.unit.conftest import make_live


def run(app, *args):
    return CliRunner().invoke(aitp, list(args), obj=type("Ctx", (), {"app": app})())


def test_the_index_finds_the_latest_decision_and_never_outgrows_the_stream(store):
    log = DecisionLog(store, maxlen=1000)
    log.append([{"task_id": f"t{i}", "n": i} for i in range(2500)])
    log.append([{"task_id": "t2400", "n": "retry"}, {"task_id": None, "n": "anonymous"}])
    assert log.find("t2400") == {"task_id": "t2400", "n": "retry"}
    assert log.find("t1999") == {"task_id": "t1999", "n": 1999}
    assert log.find("t5") is None  # trimmed with the stream
    held = store.read_records(log.stream)
    assert 1000 <= len(held) <= 1100  # whole entries of at most a tenth of the cap go
    assert log.size() <= len(held)
    assert store.client.xlen(log.stream) < 100  # packed: one entry per 100 records


def test_explain_matches_the_route_the_task_was_given(app, store, published):
    make_live(store, "aitp.acme.gpu.mid", "aitp.acme.cpu.lo")
    app.aitp.live.refresh()
    gpu = app.tasks["tests.unit.conftest.gpu"].apply_async((1,), headers={"aitp_tenant": "acme"})
    plain = app.tasks["tests.unit.conftest.plain"].apply_async(
        (1,), headers={"aitp_tenant": "globex"})
    app.aitp.live.flush()
    result = run(app, "explain", gpu.id, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["route"]["queue"] == published[0]["routing_key"] == "aitp.acme.gpu.mid"
    assert data["route"]["routed"] is True and data["tier"] == "mid"
    assert [r["factor"] for r in data["factors"]] == ["tenant", "sla", "impact", "resources",
                                                      "age"]
    weights = app.aitp.policy.priority.weights
    assert data["factors"][0]["weight"] == weights.tenant
    total = sum(r["contribution"] for r in data["factors"])
    assert abs(total - data["score"]) < 1e-9  # the contributions add up to the score
    assert data["profile"]["accelerator"] == "gpu" and data["note"] is None
    text = run(app, "explain", plain.id)
    assert text.exit_code == 0, text.output
    assert "Celery's own route (default queue default-q)" in text.output
    assert "no_live_worker" in text.output and "the tenant's max_tier mid" in text.output
    stranger = app.tasks["tests.unit.conftest.plain"].apply_async(
        (1,), headers={"aitp_tenant": "t001"})  # not in the policy: the default tenant
    app.aitp.live.flush()
    told = " ".join(run(app, "explain", stranger.id).output.split())  # lines folded
    assert "tenant default" in told and "does not list" in told
    assert "does not list" not in text.output  # globex is listed
    missing = run(app, "explain", "no-such-task")
    assert missing.exit_code == 1 and "no decision recorded" in missing.output


def test_explain_of_a_task_someone_routed_does_not_claim_the_default_queue(app, store,
                                                                          published):
    make_live(store, "aitp.acme.cpu.lo")
    app.aitp.live.refresh()
    own = app.tasks["tests.unit.conftest.plain"].apply_async(
        (1,), queue="reports", headers={"aitp_tenant": "acme"})
    app.aitp.live.flush()
    assert published[-1]["routing_key"] == "reports"
    text = run(app, "explain", own.id)
    assert text.exit_code == 0, text.output
    assert "the queue it was sent to" in text.output and "default queue" not in text.output


def test_weights_come_from_the_policy_that_decided():
    old = parse_policy({"priority": {"weights": {"age": 9}}})
    active = Policy()
    record = {"policy": policy_digest(old), "factors": {"age": 1.0}, "routed": False}
    history = [{"digest": policy_digest(old), "policy": old.model_dump(mode="json")}]
    policy, note = policy_for(record, active, policy_digest(active), history)
    assert policy.priority.weights.age == 9 and note is None
    policy, note = policy_for(record, active, policy_digest(active), [])
    assert policy is active and "not in the policy history" in note
    data = explain(record, policy, note)
    assert data["factors"][-1]["weight"] == active.priority.weights.age


def test_explain_says_which_figure_of_the_prediction_placed_the_task():
    record = {"predicted_runtime_s": 0.2, "predicted_p90_s": 3.0, "routed": True}
    median = explain({**record, "prediction_source": "model"}, Policy(), None)
    assert median["size_quantile"] == 0.5
    assert _size_rule(median) == "placed by the median"
    cautious = parse_policy({"placement": {"size_quantile": 0.9}})
    assert _size_rule(explain({**record, "prediction_source": "model"}, cautious, None)) \
        == "placed by the 0.9 quantile"
    cold = explain({**record, "prediction_source": "size_history"}, Policy(), None)
    assert _size_rule(cold) == "placed by the p90"


def test_tier_story_reads_like_the_steps():
    steps = {"size": "lo", "effective_size_s": 2.5, "bounds_s": [0.0625, 1.41],
             "floor": "mid", "cap": "hi", "fair_share": True}
    assert tier_story(steps, "lo") == (
        "effective size 2.5 s (boundaries 0.0625 s, 1.41 s) -> lo; declared floor mid; "
        "the tenant's max_tier hi; above fair share: one tier lower => lo")
    assert tier_story(steps, "lo", ("hi", "mid", "lo")).startswith(
        "effective size 2.5 s (hi < 0.0625 s; 0.0625 s <= mid < 1.41 s; lo >= 1.41 s) -> lo;")
    # an empty middle tier is left out, not shown as two equal boundaries
    assert tier_story(dict(steps, bounds_s=[0.0905, 0.0905]), "lo", ("hi", "mid", "lo")
                      ).startswith("effective size 2.5 s (hi < 0.0905 s; lo >= 0.0905 s) -> lo;")
    assert tier_story(dict(steps, bounds_of="cpu~history"), "lo").startswith(
        "effective size 2.5 s (boundaries 0.0625 s, 1.41 s of cpu~history) -> lo;")
    assert tier_story(dict(steps, bounds_s=None), "lo").startswith(
        "effective size 2.5 s; no boundaries yet -> lo;")
    assert tier_story(dict(steps, effective_size_s=None), "lo").startswith(
        "no size known -> lo;")
    assert tier_story(None, "hi") == "tier hi"


def test_entries_written_before_packing_are_found_and_trimmed(store):
    log = DecisionLog(store, maxlen=100)
    for i in range(3):  # the earlier layout: one entry and one order element per record
        entry = store.client.xadd(log.stream, {"r": json.dumps({"task_id": f"old{i}"})})
        store.client.hset(log.index, f"old{i}", entry)
        store.client.rpush(log.order, f"{entry.decode()}|old{i}")
    log.append([{"task_id": "new0"}])
    assert log.find("old1") == {"task_id": "old1"}
    assert log.find("new0") == {"task_id": "new0"}
    log.append([{"task_id": f"t{i}"} for i in range(100)])
    assert log.find("old0") is None and log.find("new0") is None  # trimmed, oldest first
    assert log.find("t99") == {"task_id": "t99"}
    assert [r["task_id"] for r in store.read_records(log.stream)] == [f"t{i}" for i in range(100)]
    assert log.size() == 100


def test_decisions_reused_or_not_read_back_as_their_own_records(app, store):
    from celery_aitp.core.request import Decision
    from celery_aitp.publish.memo import Reused, Template
    from celery_aitp.telemetry.counters import Counters

    log = DecisionLog(store, maxlen=10_000, policy_digest="d1")
    first = Decision("takeover", 100.5, "t.a", "a0")
    first.tenant, first.tier, first.score, first.origin_at = "acme", "hi", 0.25, 100.5
    retry = Decision("takeover", 300.0, "t.b", "b0")
    retry.tenant, retry.reason, retry.origin_at = "globex", "no_live_worker", 250.0
    template = Template(first, (), Counters())
    kept = Reused(template, "a0", 100.5)
    again = [Reused(template, f"a{i}", 100.5 + i) for i in range(1, 4)]
    items = [kept, retry, *again, {"task_id": "c0", "note": "a plain record"}]
    log.append(items)
    expected = [dict(item.record() if hasattr(item, "record") else item, policy="d1")
                for item in items]
    assert store.read_records(log.stream) == expected
    assert log.find("a2") == expected[3] and log.find("b0")["origin_at"] == 250.0
    fields = store.client.xrange(log.stream)[-1][1]
    assert set(fields) == {b"n", b"p"} and fields[b"n"] == b"6"
    assert json.loads(fields[b"p"])["s"].count(json.loads(fields[b"p"])["s"][0]) == 1
    assert len(json.loads(fields[b"p"])["s"]) == 3  # the four copies of one decision share one


def test_the_dashboard_tail_reads_packed_entries(store):
    import time

    from celery_aitp.dashboard.streams import StreamTail

    log = DecisionLog(store, maxlen=10_000)
    log.append([{"task_id": f"a{i}"} for i in range(30)])
    tail = StreamTail(store.client, log.stream, window_s=3600, max_recent=5)
    assert tail.poll(time.time()) == []  # the back-fill reports nothing as new
    assert [r["task_id"] for r in tail.records()] == [f"a{i}" for i in range(25, 30)]
    log.append([{"task_id": "b0"}, {"task_id": "b1"}])
    assert [r["task_id"] for r in tail.poll(time.time())] == ["b0", "b1"]
    assert tail.find("task_id", "a3") == {"task_id": "a3"}  # beyond the window: the stream
    assert tail.find("task_id", "zz") is None


def test_a_table_wraps_a_long_cell_rather_than_cutting_it(monkeypatch):
    """Piped output is 80 columns: task names cut to one prefix could not be told apart."""
    from rich.console import Console

    from celery_aitp.cli import output

    narrow = Console(width=40, record=True, force_terminal=False)
    monkeypatch.setattr(output, "console", narrow)
    output.table("runs", ["task", *"abcdef"], [("proj.report_generation", *range(6)),
                                               ("proj.resize_in_bulk", *range(6))])
    text = narrow.export_text()
    assert "…" not in text
    cells = "".join(line.split("│")[1].strip() for line in text.splitlines()
                    if line.startswith("│"))
    assert "proj.report_generation" in cells and "proj.resize_in_bulk" in cells
