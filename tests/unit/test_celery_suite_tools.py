"""The tools that run Celery's own suite (tests/celery_suite): what they accept, compare."""

from __future__ import annotations

import pytest

from tests.celery_suite.plugin import _is_tier_queue_check, is_tier_queue
from tests.celery_suite.run import confirm_differences, summarize

CHECK = ("Integration session app must only use the shared celery queue; found {}. "
         "Tests that need additional queues belong in t/smoke/tests/.")


def failure(message: str) -> BaseException:
    with pytest.raises(pytest.fail.Exception) as caught:
        pytest.fail(message)
    return caught.value


def test_tier_queues_of_both_layouts_are_recognised():
    assert is_tier_queue("aitp.default.cpu.hi") and is_tier_queue("aitp.acme.gpu")
    assert not is_tier_queue("celery") and not is_tier_queue("aitp.x")
    assert not is_tier_queue("aitp..cpu") and not is_tier_queue("other.acme.cpu.hi")


def test_the_teardown_check_is_accepted_only_for_tier_queues_of_the_session_app():
    tiers = "['aitp.default.cpu.hi', 'aitp.default.cpu.lo', 'celery']"
    assert _is_tier_queue_check(failure(CHECK.format(tiers)))
    extra = "['aitp.default.cpu.hi', 'celery', 'smoke']"
    assert not _is_tier_queue_check(failure(CHECK.format(extra)))
    function_app = CHECK.format(tiers).replace("session app", "function app")
    assert not _is_tier_queue_check(failure(function_app))
    assert not _is_tier_queue_check(failure("something else failed"))
    assert not _is_tier_queue_check(ValueError(CHECK.format(tiers)))


def result(outcomes: dict[str, str], tier: int = 0, other: int = 0) -> dict:
    return {"outcomes": outcomes, "deliveries": {"tier": tier, "other": other}}


def test_the_comparison_flags_any_outcome_that_differs_from_plain_celery():
    plain = result({"a": "passed", "b": "failed", "c": "skipped"}, other=9)
    same = result({"a": "passed", "b": "failed", "c": "skipped"}, tier=8, other=1)
    table, ok = summarize({"plain": plain, "takeover": same})
    assert ok and "b: failed" in table  # plain's own failure is listed apart
    worse = result({"a": "failed", "b": "failed", "c": "skipped"}, tier=8, other=1)
    table, ok = summarize({"plain": plain, "split": worse})
    assert not ok and "a: plain passed, split failed" in table
    missing = result({"a": "passed", "b": "failed"}, tier=8, other=1)
    assert not summarize({"plain": plain, "coexistence": missing})[1]


def test_takeover_must_send_most_deliveries_through_tier_queues():
    plain = result({"a": "passed"}, other=4)
    assert not summarize({"plain": plain, "takeover": result({"a": "passed"}, 2, 2)})[1]
    assert summarize({"plain": plain, "takeover": result({"a": "passed"}, 3, 1)})[1]
    assert summarize({"plain": plain, "coexistence": result({"a": "passed"}, 0, 4)})[1]


def test_a_difference_counts_only_if_it_repeats():
    results = {"plain": result({"a": "failed", "b": "passed"}, other=4),
               "split": result({"a": "passed", "b": "failed"}, 2, 2),
               "takeover": result({"a": "failed", "b": "passed"}, 4, 0)}
    asked = []

    def run(stages, tests):  # the race in "a" does not repeat; "b" fails in split again
        asked.append((stages, tests))
        return {"plain": result({"a": "passed", "b": "passed"}),
                "split": result({"a": "passed", "b": "failed"}),
                "takeover": result({"a": "passed", "b": "passed"})}

    confirm_differences(results, run)
    every = ["plain", "split", "takeover"]
    assert asked == [(every, ["a", "b"]), (every, ["b"])]
    table, ok = summarize(results)
    assert not ok and "b: plain passed, split failed" in table and "a: plain" not in table
    assert results["takeover"]["deliveries"] == {"tier": 4, "other": 0}  # the first run's


def test_a_brokers_known_differences_are_left_out_of_every_stage():
    from tests.celery_suite.run import with_known_differences_left_out

    assert with_known_differences_left_out(None, "redis") is None
    assert with_known_differences_left_out(None, "rabbitmq") == "not (test_expired)"
    assert with_known_differences_left_out("priority", "rabbitmq") == \
        "(priority) and not (test_expired)"
