"""The side-by-side demo's workload and figures (the runs themselves: tests/integration)."""

from __future__ import annotations

import math

import pytest

from celery_aitp.demo.versus import LONG_SHARE, SLOTS, Item, figures, workload


def test_the_workload_is_seeded_mixed_and_offers_the_load_asked_for():
    items = workload(600.0, 0.85, seed=1)
    assert items == workload(600.0, 0.85, seed=1)
    assert all(0 <= a.at < b.at < 600 for a, b in zip(items, items[1:], strict=False))
    long = [i for i in items if i.task == "transcode"]
    assert abs(len(long) / len(items) - LONG_SHARE) < 0.03
    assert all(500 <= i.ms <= 1500 for i in long)
    assert all(10 <= i.ms <= 50 for i in items if i.task == "thumbnail")
    offered = sum(i.ms for i in items) / 1000 / (600 * SLOTS)
    assert offered == pytest.approx(0.85, rel=0.08)


def test_figures_count_lost_tasks_and_split_short_from_long():
    items = [Item(0, "thumbnail", 20), Item(0, "thumbnail", 40), Item(0, "transcode", 1000),
             Item(0, "transcode", 500)]
    found = figures(items, [0.1, 0.3, 2.0, None])
    assert found.tasks == 4 and found.lost == 1
    assert found.short_p50_s == pytest.approx(0.2) and found.long_max_s == 2.0
    # bounded slowdown, runtimes floored at 0.1 s: (0.1+0.02)/0.1, (0.3+0.04)/0.1, 3/1
    assert found.mean_slowdown == pytest.approx((1.2 + 3.4 + 3.0) / 3)
    assert math.isnan(figures(items[:2], [None, None]).mean_slowdown)
