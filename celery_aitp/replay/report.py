"""Plots and the self-contained HTML report of a replay (no network, no JavaScript).

The plots take a neutral :class:`RunSeries` (publish and start time per task, plus its
tier label), so the scheduling benchmark draws its measured runs with the same code.
numpy (the ``replay`` extra) is imported by the functions that use it, as in
:mod:`celery_aitp.replay.metrics`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING

from celery_aitp.replay.metrics import RunStats, Target
from celery_aitp.replay.svg import PALETTE, Axes, Line, chart, grid

if TYPE_CHECKING:
    import numpy as np

RUN_COLORS = {"fifo": "#7f7f7f", "oracle": "#2ca02c"}
WAIT_FLOOR_S = 1e-3  # waits below 1 ms are drawn at 1 ms on the log axis


@dataclass(frozen=True)
class RunSeries:
    name: str
    published: Sequence[float]
    started: Sequence[float]  # NaN for a task that never started
    tiers: Sequence[str]


def _run_colors(runs: Sequence[RunSeries]) -> dict[str, str]:
    others = iter(c for c in PALETTE if c not in RUN_COLORS.values())
    return {r.name: RUN_COLORS.get(r.name) or next(others) for r in runs}


def _cdf(waits: np.ndarray, points: int = 200) -> tuple[list[float], list[float]]:
    import numpy as np

    if waits.size == 0:
        return [], []
    qs = np.linspace(0, 1, min(points, waits.size) + 1)
    xs = np.maximum(np.quantile(waits, qs), WAIT_FLOOR_S)
    return xs.tolist(), qs.tolist()


def _waits(run: RunSeries, tier: str | None = None) -> np.ndarray:
    import numpy as np

    pub, start = np.asarray(run.published, float), np.asarray(run.started, float)
    mask = ~np.isnan(start)
    if tier is not None:
        mask &= np.asarray(run.tiers, dtype=object) == tier
    return start[mask] - pub[mask]


def wait_cdf_svg(runs: Sequence[RunSeries], tiers: Sequence[str]) -> str:
    """One panel per tier: the share of tasks that waited at most x seconds, per run."""
    import numpy as np

    colors = _run_colors(runs)
    present = [t for t in tiers if any(t in r.tiers for r in runs)]
    every = np.concatenate([_waits(r) for r in runs]) if runs else np.zeros(0)
    top = max(float(every.max()) if every.size else 1.0, WAIT_FLOOR_S * 10)
    panels = []
    for tier in present:
        lines = [Line(r.name, *_cdf(_waits(r, tier)), colors[r.name], dashed=r.name == "oracle")
                 for r in runs]
        panels.append(chart(lines, Axes(f"tier {tier}: wait distribution", "wait (s, log)",
                                        "share of tasks", x_log=True,
                                        x_range=(WAIT_FLOOR_S, top * 1.2), y_range=(0, 1),
                                        legend_left=True)))
    return grid(panels, columns=min(3, max(1, len(panels))))


def depth_series(run: RunSeries, tier: str, grid_t: np.ndarray, t0: float) -> list[int]:
    """Tasks of ``tier`` published but not started, at each grid time (seconds from t0)."""
    import numpy as np

    pub = np.asarray(run.published, float)
    start = np.asarray(run.started, float)
    mask = np.asarray(run.tiers, dtype=object) == tier
    p = np.sort(pub[mask] - t0)
    s = np.sort(np.where(np.isnan(start[mask]), np.inf, start[mask]) - t0)
    queued = np.searchsorted(p, grid_t, side="right") - np.searchsorted(s, grid_t, side="right")
    return queued.tolist()


def depth_svg(runs: Sequence[RunSeries], tiers: Sequence[str], points: int = 300) -> str:
    """One panel per run: queued tasks per tier over time (from each run's first publish)."""
    import numpy as np

    runs = [r for r in runs if len(r.published)]
    if not runs:
        return grid([], 1)
    spans = []
    for r in runs:
        ends = [s for s in r.started if not math.isnan(s)]
        spans.append((max(ends) if ends else max(r.published)) - min(r.published))
    grid_t = np.linspace(0, max(spans) or 1.0, points)
    per_run = [(r, {t: depth_series(r, t, grid_t, min(r.published)) for t in tiers
                    if t in r.tiers}) for r in runs]
    peak = max([1] + [max(v) for _r, series in per_run for v in series.values() if v])
    panels = []
    for r, series in per_run:
        lines = [Line(f"tier {t}", grid_t.tolist(), v, PALETTE[k % len(PALETTE)])
                 for k, (t, v) in enumerate(series.items())]
        panels.append(chart(lines, Axes(f"{r.name}: queue depth", "time (s)", "queued tasks",
                                        y_range=(0, peak * 1.05))))
    return grid(panels, columns=min(3, len(panels)))


def _stats_table(stats: Sequence[RunStats]) -> str:
    head = ("run", "group", "tasks", "wait p50 s", "wait p95 s", "wait max s",
            "mean slowdown", "SLA hit")
    rows = ["<tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for st in stats:
        for g in st.groups:
            hit = "" if g.sla_hit is None else f"{100 * g.sla_hit:.1f}%"
            group = "all" if g.kind == "all" else f"{g.kind} {escape(g.name)}"
            cells = (escape(st.run), group, str(g.tasks), f"{g.wait_p50_s:.3g}",
                     f"{g.wait_p95_s:.3g}", f"{g.wait_max_s:.3g}", f"{g.mean_slowdown:.3g}", hit)
            rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return "<table>" + "\n".join(rows) + "</table>"


def _jain(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def _run_table(stats: Sequence[RunStats]) -> str:
    rows = ["<tr><th>run</th><th>Jain's index (tenant slowdowns)</th><th>tasks lost</th></tr>"]
    rows += [f"<tr><td>{escape(s.run)}</td><td>{_jain(s.jain)}</td><td>{s.lost}</td></tr>"
             for s in stats]
    return "<table>" + "\n".join(rows) + "</table>"


def _targets(found: Sequence[Target]) -> str:
    items = [f"<li>{escape(t.name)}: <b>{t.value:.3f}</b> (target &le; {t.limit:g}) "
             f"<span class='{'ok' if t.met else 'bad'}'>{'met' if t.met else 'not met'}"
             "</span></li>" for t in found]
    return "<ul>" + "".join(items) + "</ul>"


STYLE = """body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;font-size:13px;margin:1em 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}th{background:#f5f5f5}
td:nth-child(-n+2),th:nth-child(-n+2){text-align:left}.ok{color:#2a7a2a}.bad{color:#b22}
.meta{color:#555}svg{max-width:100%;height:auto}"""


def html_report(title: str, meta: Sequence[str], stats: Sequence[RunStats],
                found: Sequence[Target], runs: Sequence[RunSeries], tiers: Sequence[str]) -> str:
    """The whole report as one HTML document with inline SVG."""
    meta_html = "".join(f"<li>{escape(m)}</li>" for m in meta)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{escape(title)}</h1>"
            f"<ul class='meta'>{meta_html}</ul><h2>Targets</h2>{_targets(found)}"
            f"<h2>Waits, slowdown and SLA</h2>{_stats_table(stats)}{_run_table(stats)}"
            f"<h2>Wait distribution per tier</h2>{wait_cdf_svg(runs, tiers)}"
            f"<h2>Queue depth over time</h2>{depth_svg(runs, tiers)}</body></html>\n")
