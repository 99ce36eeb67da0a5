"""Guarded promotion and rollback: step the split up while the routed arm passes.

Like an Argo Rollouts canary with a background analysis: the guard sets the split to
the first of ``guard.steps``; every ``interval_s`` it analyses the runs recorded since
its previous verdict (:mod:`celery_aitp.migration.checks`). ``passes_per_step``
passing analyses move it to the next step; after the last, it switches to takeover
(``promote``) or stays. Each failed analysis is counted; at ``failure_limit`` it rolls
back to coexistence (tier queues drained, nothing lost) and says why, in its output
and in the audit log. Too few routed runs make an analysis inconclusive: it waits.

It keeps watching after takeover (``watch_takeover``): the same analyses run on the
takeover stage's runs, all of them one routed arm, compared with the *baseline*: the
control group of the last split analysis that had ``min_samples`` control runs (there
is no control group when everything is routed). ``failure_limit`` failed analyses in
takeover step back to split at the last step below 100% (or to coexistence, by
``takeover_step_back``), audited like every other move; the guard then watches that
split and does not promote again in the same run, so a bad takeover cannot flap.

It only ever writes the stage with compare-and-set against what it wrote last, so a
change made by hand meanwhile stops the guard instead of being overwritten. One guard
runs at a time (an expiring lock); ``dry_run`` changes nothing and reports what it would do.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from celery_aitp.errors import AdapterError, AitpError, StageConflict, StoreError
from celery_aitp.migration import guard_state
from celery_aitp.migration.analysis import ArmStats, arm_stats, takeover_stats
from celery_aitp.migration.checks import Analysis, analyse
from celery_aitp.migration.control import StageControl, who_am_i
from celery_aitp.migration.records import MAX_RECORDS, last_id, records_since
from celery_aitp.policy import GuardSettings, SplitSettings, Stage
from celery_aitp.publish.split import SplitRule

logger = logging.getLogger(__name__)

#: Final states: switched to takeover, stayed at the last step, rolled back, stopped.
PROMOTED, COMPLETED, ROLLED_BACK, STOPPED = "promoted", "completed", "rolled_back", "stopped"
#: Analyses in a row that may fail on store or broker errors before the guard stops.
ERROR_LIMIT = 3


class GuardError(AitpError):
    """The guard cannot start (already in takeover, another guard runs, ...)."""


class Guard:
    """One guard run over a deployment; :meth:`step` is one analysis and its consequence."""

    def __init__(self, middleware: Any, settings: GuardSettings | None = None,
                 dry_run: bool | None = None, control: StageControl | None = None,
                 say: Callable[[str], None] | None = None) -> None:
        self.middleware = middleware
        self.settings = settings or middleware.policy.guard
        self.dry_run = self.settings.dry_run if dry_run is None else dry_run
        self.control = control or StageControl(middleware)
        self.say = say or (lambda text: logger.warning("aitp guard: %s", text))
        self.who = who_am_i("guard")
        self.index = 0
        self.passes = 0
        self.failures = 0
        self.state = "running"
        self.last: Analysis | None = None
        #: True while the stage is takeover: the guard watches it against ``baseline``.
        self.watching = False
        #: The control group of the last split analysis with enough control runs.
        self.baseline: ArmStats | None = None
        self.may_promote = self.settings.promote
        self._split = SplitSettings()
        self._doc: dict[str, Any] | None = None  # what the stage is as far as we know
        self._cursor: str | None = None
        self._pending: list[dict[str, Any]] = []  # runs not judged yet

    @property
    def store(self) -> Any:
        return self.middleware.store

    @property
    def percent(self) -> float:
        return self.settings.steps[self.index]

    @property
    def lock_ttl_s(self) -> float:
        return 3 * self.settings.interval_s + 10

    # --- start ------------------------------------------------------------------

    def start(self) -> None:
        """Take the lock, pick the starting step and set the split to it."""
        stage, split, doc = self.control.read()
        if stage is Stage.TAKEOVER and not self.settings.watch_takeover:
            raise GuardError("the stage is takeover already: nothing to guard "
                             "(switch to split or coexistence first, or set "
                             "guard.watch_takeover)")
        if not self.dry_run and not guard_state.acquire(self.store, self.who, self.lock_ttl_s):
            raise GuardError("another guard is running (see 'celery aitp status')")
        steps = self.settings.steps
        if stage is Stage.TAKEOVER:
            self.index, self.watching, self.may_promote = len(steps) - 1, True, False
            self._split, self._doc = split, doc
            self._cursor = last_id(self.store, self.store.keys.observations) or "0-0"
            self.baseline = self._saved_baseline()
            self.say(f"watching takeover against the last guard's baseline of "
                     f"{self.baseline.n} control runs" if self.baseline else
                     "watching takeover (no split baseline: the checks against a control "
                     "group are skipped)")
            self._save()
            return
        current = split.percent if stage is Stage.SPLIT else 0.0
        self.index = next((i for i, p in enumerate(steps) if p >= current), len(steps) - 1)
        self._split, self._doc = split, doc
        self._cursor = last_id(self.store, self.store.keys.observations) or "0-0"
        if stage is Stage.SPLIT and split.percent == self.percent:
            self.say(f"watching split at {self.percent:g}% (step {self.index + 1}/{len(steps)})")
        else:
            self._set_split(f"guard: start at step 1/{len(steps)}" if self.index == 0 else
                            f"guard: resume at step {self.index + 1}/{len(steps)}")
        self._save()

    # --- one analysis -----------------------------------------------------------

    def analyse(self) -> Analysis:
        """Check the conditions over the runs recorded since the last verdict.

        Runs seen by an inconclusive analysis are kept for the next one, so every
        verdict rests on at least ``min_samples`` routed runs however slow the traffic.
        """
        records, self._cursor = records_since(self.store, self.store.keys.observations,
                                              after_id=self._cursor)
        self._pending = (self._pending + records)[-MAX_RECORDS:]
        policy = self.middleware.policy
        if self.watching:  # everything is routed: compare with the split's baseline
            arms = {"routed": takeover_stats(self._pending, policy),
                    "control": self.baseline or ArmStats()}
        else:
            arms = arm_stats(self._pending, policy, SplitRule(self._split))
            control = arms.get("control")
            if control is not None and control.n >= self.settings.min_samples:
                self.baseline = control
        analysis = analyse(self.settings, policy, arms, self._queue_ages())
        if analysis.verdict != "inconclusive":
            self._pending = []
        return analysis

    def _queue_ages(self) -> dict[str, float | None] | None:
        janitor = self.control.janitor
        try:
            return dict(janitor.ops.oldest_ages(janitor.known_queues(), time.time()))
        except AdapterError as exc:
            self.say(f"queue ages unavailable, starvation not checked: {exc}")
            return None

    def step(self) -> bool:
        """One analysis and what follows from it; False once the guard is done."""
        if not self._still_ours():
            return False
        analysis = self.last = self.analyse()
        self.say(f"{self.where}: {analysis.summary}")
        if analysis.verdict == "pass":
            self._passed()
        elif analysis.verdict == "fail":
            self._failed(analysis)
        self._save()
        return self.state == "running"

    @property
    def where(self) -> str:
        """Where the guard stands, as its messages say it."""
        if self.watching:
            return "takeover"
        return f"step {self.index + 1}/{len(self.settings.steps)} at {self.percent:g}%"

    def _passed(self) -> None:
        if self.watching:
            self.passes = 0  # takeover holds: keep watching
            return
        self.passes += 1
        if self.passes < self.settings.passes_per_step:
            return
        self.passes = 0
        if self.index + 1 < len(self.settings.steps):
            self.index += 1
            self._set_split(f"guard: step {self.index}/{len(self.settings.steps)} passed, "
                            f"promote to {self.percent:g}%")
        elif self.may_promote:
            self._write(Stage.TAKEOVER, "guard: every step passed, promote to takeover")
            if self.state != "running":
                return  # the write found a change by someone else
            if self.settings.watch_takeover and not self.dry_run:
                self.watching, self.failures = True, 0
                base = self.baseline
                self.say("promoted to takeover; watching it against the baseline of "
                         + (f"{base.n} control runs" if base else "no control runs "
                            "(checks against a control group skipped)"))
            else:
                self._finish(PROMOTED, "promoted to takeover")
        else:
            again = "" if self.may_promote == self.settings.promote else \
                " (stepped back from takeover in this run: not promoting again)"
            self._finish(COMPLETED, f"every step passed; staying in split at "
                                    f"{self.percent:g}%{again}")

    def _failed(self, analysis: Analysis) -> None:
        self.failures += 1
        limit = self.settings.failure_limit
        if self.failures < limit:
            self.say(f"failed analyses: {self.failures}/{limit} "
                     f"({'step back' if self.watching else 'rollback'} at {limit})")
            return
        details = "; ".join(c.detail for c in analysis.failed)
        if self.watching and self._step_back(details):
            return
        at = "in takeover" if self.watching else f"at {self.percent:g}%"
        why = f"guard: rollback after {self.failures} failed analyses {at}: {details}"
        if self.dry_run:
            self._finish(ROLLED_BACK, f"would roll back to coexistence ({why})")
            return
        try:
            change = self.control.rollback(self.who, why, expect=self._doc)
        except StageConflict:
            self._finish(STOPPED, "the stage was changed by someone else; not rolling back")
            return
        self._doc = change.new
        self._finish(ROLLED_BACK, f"rolled back to coexistence: {why}; moved "
                                  f"{change.moved_total} waiting message(s) to the default queue")

    def _step_back(self, details: str) -> bool:
        """Takeover failed: back to split at the last step below 100%, guarded again.
        False when the policy says coexistence, or no step is below 100%."""
        steps = self.settings.steps
        below = [i for i, p in enumerate(steps) if p < 100]
        if self.settings.takeover_step_back != "split" or not below:
            return False
        index = below[-1]
        why = (f"guard: step back from takeover to split {steps[index]:g}% after "
               f"{self.failures} failed analyses: {details}")
        if self.dry_run:
            self._finish(ROLLED_BACK, f"would step back ({why})")
            return True
        split = self._split.model_copy(update={"percent": steps[index]})
        try:
            change = self.control.change(Stage.SPLIT, split, self.who, why, expect=self._doc)
        except StageConflict:
            self._finish(STOPPED, "the stage was changed by someone else; not stepping back")
            return True
        self._doc, self._split, self.index = change.new, split, index
        self.watching, self.may_promote = False, False
        self.failures = self.passes = 0
        self.say(f"stepped back to split at {steps[index]:g}%: {why}; watching the split, "
                 "no promotion again in this run")
        return True

    # --- writing ----------------------------------------------------------------

    def _set_split(self, why: str) -> None:
        self._split = self._split.model_copy(update={"percent": self.percent})
        self._write(Stage.SPLIT, why)

    def _write(self, stage: Stage, why: str) -> None:
        if self.dry_run:
            self.say(f"dry run: would set {stage.value}"
                     + (f" {self.percent:g}%" if stage is Stage.SPLIT else "") + f" ({why})")
            return
        try:
            change = self.control.change(stage, self._split, self.who, why, expect=self._doc)
        except StageConflict:
            self._finish(STOPPED, "the stage was changed by someone else; the guard stops")
            return
        self._doc = change.new
        self.say(why)

    def _saved_baseline(self) -> ArmStats | None:
        """The baseline the last guard kept in the store (a guard started in takeover)."""
        previous = guard_state.read_guard_state(self.store)
        return guard_state.baseline_of(previous.get("baseline")) if previous else None

    def _still_ours(self) -> bool:
        """False (and stop) if the stage was changed by anyone but this guard."""
        if self.dry_run:
            return True
        doc = self.store.read_stage()
        if doc == self._doc:
            return guard_state.renew(self.store, self.who, self.lock_ttl_s) or self._lost_lock()
        last = self.store.stage_history(1)
        by = last[0].get("who") if last else "someone"
        self._finish(STOPPED, f"the stage was changed by {by}; the guard stops")
        self._save()
        return False

    def _lost_lock(self) -> bool:
        self._finish(STOPPED, "lost the guard lock (another guard took over)")
        return False

    def _finish(self, state: str, message: str) -> None:
        self.state = state
        self.say(message if not self.dry_run or state != ROLLED_BACK else f"dry run: {message}")

    def _save(self) -> None:
        if self.dry_run:
            return
        last = self.last
        guard_state.write_guard_state(self.store, {
            "state": self.state, "owner": self.who, "steps": list(self.settings.steps),
            "step": self.index, "percent": self.percent, "passes": self.passes,
            "watching": "takeover" if self.watching else "split",
            "baseline": guard_state.baseline_doc(self.baseline) if self.baseline else None,
            "failures": self.failures, "failure_limit": self.settings.failure_limit,
            "last": {"at": time.time(), "verdict": last.verdict, "summary": last.summary}
            if last else None,
        })
        if self.state != "running":
            guard_state.release(self.store, self.who)

    # --- the loop ---------------------------------------------------------------

    def run(self, stop: threading.Event | None = None) -> str:
        """Start, then analyse every ``interval_s`` until done (or ``stop`` is set)."""
        stop = stop or threading.Event()
        self.start()
        errors = 0
        try:
            while not stop.wait(self.settings.interval_s):
                try:
                    if not self.step():
                        break
                    errors = 0
                except (StoreError, AdapterError) as exc:
                    errors += 1
                    self.say(f"analysis skipped ({errors} of {ERROR_LIMIT} in a row): {exc}")
                    if errors >= ERROR_LIMIT:
                        self._finish(STOPPED, "the store or broker keeps failing; the stage "
                                              "stays as it is")
                        break
            else:
                self._finish(STOPPED, "interrupted; the stage stays as it is")
        finally:
            if self.state == "running":
                self._finish(STOPPED, "stopped; the stage stays as it is")
            self._save()
        return self.state
