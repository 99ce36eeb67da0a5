"""One guard analysis: the policy's conditions checked against the arms' runs.

Pure: it gets the arm statistics of the runs recorded since the previous analysis and
the age of the oldest message in each tier queue, and returns a verdict (``pass``,
``fail`` or ``inconclusive``) with one line per condition, so the guard can say why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from celery_aitp.migration.analysis import ArmStats
from celery_aitp.policy import GuardSettings, Policy
from celery_aitp.queues import parse_tier_queue


@dataclass
class Check:
    """One condition: passed (True), failed (False) or not checked (None), and why."""

    name: str
    ok: bool | None
    detail: str


@dataclass
class Analysis:
    """The verdict of one analysis and every check behind it."""

    verdict: str  # 'pass', 'fail' or 'inconclusive'
    routed_runs: int
    control_runs: int
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.ok is False]

    @property
    def summary(self) -> str:
        """``fail: sla_hit_rate 40% < 95%`` or ``pass: 54 routed runs; sla ...``."""
        shown = self.failed if self.verdict == "fail" else [
            c for c in self.checks if c.ok is not None]
        details = "; ".join(c.detail for c in shown)
        head = f"{self.verdict} ({self.routed_runs} routed, {self.control_runs} control runs)"
        return f"{head}: {details}" if details else head


def _pct(x: float) -> str:
    return f"{x:.1%}"


def _sla(cond: float | None, routed: ArmStats) -> Check:
    rate = routed.sla_hit_rate
    if cond is None or rate is None:
        return Check("sla_hit_rate", None, "sla_hit_rate not checked")
    ok = rate >= cond
    return Check("sla_hit_rate", ok, f"sla_hit_rate {_pct(rate)} {'>=' if ok else '<'} "
                                     f"{_pct(cond)}")


def _wait(ratio: float | None, slack: float, routed: ArmStats, control: ArmStats,
          min_samples: int) -> Check:
    ours, theirs = routed.wait(0.9), control.wait(0.9)
    if ratio is None or ours is None:
        return Check("wait", None, "wait not checked")
    if theirs is None or control.n < min_samples:
        return Check("wait", None, f"wait not checked ({control.n} control runs)")
    limit = ratio * theirs + slack
    ok = ours <= limit
    return Check("wait", ok, f"wait p90 {ours:.3g} s {'<=' if ok else '>'} {ratio:g} x "
                             f"{theirs:.3g} s + {slack:g} s")


def _share_at_most(name: str, share: float | None, cond: float | None) -> Check:
    """A share of the routed arm's runs (prediction error, fallbacks) within its limit."""
    if cond is None or share is None:
        return Check(name, None, f"{name} not checked")
    ok = share <= cond
    return Check(name, ok, f"{name} {_pct(share)} {'<=' if ok else '>'} {_pct(cond)}")


def _starvation(factor: float | None, policy: Policy,
                ages: Mapping[str, float | None] | None) -> Check:
    if factor is None or ages is None:
        return Check("starvation", None, "starvation not checked")
    sla = {t.name: t.sla_s for t in policy.tiers}
    worst: tuple[float, str, float] | None = None
    for queue, age in ages.items():
        parsed = parse_tier_queue(queue)
        if age is None or parsed is None or parsed[2] not in sla:
            continue
        ratio = age / sla[parsed[2]]
        if worst is None or ratio > worst[0]:
            worst = (ratio, queue, age)
    if worst is None:
        return Check("starvation", True, "starvation: tier queues empty")
    ok = worst[0] <= factor
    return Check("starvation", ok, f"oldest in {worst[1]} waited {worst[2]:.3g} s = "
                                   f"{worst[0]:.2g} x SLA {'<=' if ok else '>'} {factor:g}")


def _failures(cond: float | None, routed: ArmStats, control: ArmStats,
              min_samples: int) -> Check:
    ours, theirs = routed.failure_rate, control.failure_rate
    if cond is None or ours is None or theirs is None or control.n < min_samples:
        return Check("failure_rate", None, "failure_rate not checked")
    ok = ours <= theirs + cond
    return Check("failure_rate", ok, f"failure_rate {_pct(ours)} {'<=' if ok else '>'} "
                                     f"{_pct(theirs)} + {_pct(cond)}")


def analyse(settings: GuardSettings, policy: Policy, arms: Mapping[str, ArmStats],
            queue_ages: Mapping[str, float | None] | None) -> Analysis:
    """Check every condition; fail if any fails, inconclusive with too few routed runs."""
    cond, n = settings.conditions, settings.min_samples
    routed, control = arms["routed"], arms.get("control") or ArmStats()
    enough = routed.n >= n
    sampled = [
        _sla(cond.min_sla_hit_rate, routed),
        _wait(cond.max_wait_ratio, cond.wait_slack_s, routed, control, n),
        _share_at_most("prediction_error", routed.prediction_error,
                       cond.max_prediction_error),
        _share_at_most("fallback_rate", routed.fallback_rate, cond.max_fallback_rate),
        _failures(cond.max_failure_rate_increase, routed, control, n),
    ]
    if not enough:  # too few routed runs to judge the arm by them
        sampled = [Check(c.name, None, c.detail) for c in sampled]
    checks = [*sampled, _starvation(cond.max_queue_age_sla, policy, queue_ages)]
    if any(c.ok is False for c in checks):
        verdict = "fail"
    elif enough:
        verdict = "pass"
    else:
        verdict = "inconclusive"
    return Analysis(verdict, routed.n, control.n, checks)
