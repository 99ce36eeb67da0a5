"""Hand a whole decision out again to the tasks that would get the very same one.

Between two refreshes of the live view (one a second by default) every stage is a pure
function of the task name, the tenant (and the note its resolution counts), the model's
cache key and the view, for a task that

* is published for the first time (a retry's age comes from the running task),
* has no ETA (the visibility guard compares it with the clock),
* carries no ``aitp_labels`` header (read per publish by the priority stage),
* in the split stage, meets a split whose selectors do not look at the decision (no
  ``tiers``, no ``max_uncertainty``): its arm then follows from the task id, the task
  and the tenant alone, and becomes part of the key.

So the first such task of a key runs the pipeline, and its decision is kept as a
:class:`Template`: the ``aitp`` header, the record's JSON without the id and the time,
the counter, the fair-share charge and the route. The next task with the same key gets
a :class:`Reused` (the template, its own id and time) instead of the profile, priority,
route and gate stages, a Decision and its record encoding: the same header, record,
counters and route at a fraction of the cost. The key is read straight from Celery's
message (:meth:`DecisionMemo.key`), so such a task gets no Request either; the middleware
builds one only for :meth:`DecisionMemo.make`, when :meth:`DecisionMemo.find` has none.

A task someone routed (``queue=``, a ``task_routes`` match) keeps its queue; its
decision is the pipeline's with the explicit-queue fallback applied, which depends only
on whether that queue is a tier queue and, if so, whether a live worker serves it. Those
two facts are the key's *variant* (None for a task nobody routed).

With a model, the stages after ``predict`` read the model's cache key only through the
prediction (p50, p90) it leads to, and many keys lead to the same one (a forest has
finitely many leaves). So a template is also kept by its *outcome key*, the memo key
with the prediction in place of the cache key: a task whose cache key is new walks the
forests (no more) and, if an earlier task of the same task, tenant, note, demotion,
arm and variant got the same prediction, reuses that decision too.

No decision outlives the state it was made on: the memo belongs to one view, and a new
view keeps it only if everything the stages read from a view is unchanged
(:func:`view_fingerprint`: stage, split, freshness, live queues, the model, history and
profile book, the tenants above their fair share); otherwise it starts empty. A decision
the visibility guard flagged is never kept (its warning is rate-limited per publish).

Only the default stages are known to be pure: a pipeline holding any other stage
(``Middleware.use_stage``), or a model whose forests cannot be walked over its cache key,
does not use the memo.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from celery_aitp.policy import Stage
from celery_aitp.predict.history import EMPTY_HISTORY, HISTORY_SOURCE
from celery_aitp.predict.model_source import MODEL_SOURCE
from celery_aitp.predict.stages import FeatureStage, PredictStage
from celery_aitp.publish.live_view import View
from celery_aitp.publish.pipeline import Pipeline
from celery_aitp.publish.priority_stage import PriorityStage
from celery_aitp.publish.profile_stage import ProfileStage
from celery_aitp.publish.request import (
    Decision,
    HeaderFrame,
    Request,
    header_json,
    prefix_of,
    record_json_of,
    root_id_of,
)
from celery_aitp.publish.split import SplitRule, arm_key
from celery_aitp.publish.stages import GateStage, RouteStage, TenantStage
from celery_aitp.publish.visibility_stage import VISIBILITY_REASONS, VisibilityStage
from celery_aitp.scheduling.usage import USAGE_SOURCE
from celery_aitp.telemetry.counters import Counters

#: Stage classes whose output depends only on the memo key and the view.
PURE_STAGES = (TenantStage, FeatureStage, PredictStage, ProfileStage, PriorityStage,
               RouteStage, GateStage, VisibilityStage)
#: Templates kept before the memo starts over (about a kilobyte each).
MEMO_LIMIT = 10_000
_SPLIT = Stage.SPLIT  # read per publish: a module global is found faster than a member
#: Where the model's cache key sits in a memo key, (task, tenant, note, demoted, arm,
#: variant, cache key); what precedes it starts the outcome key too.
_CACHE_KEY_AT = 6


def view_fingerprint(view: View) -> tuple[Any, ...]:
    """Everything the default stages read from a view, comparable with ``==``.

    Sources compare by identity (the model and the history are the same objects until
    they change), except the profile book, rebuilt on every fetch: by its profiles
    (frozen, compared by value). Two are left out because the memo key holds what the
    stages read of them: fair-share usage (whether the task's tenant is demoted; one
    tenant crossing its share would otherwise empty the memo for all), and, with a model,
    the history (it enters a decision only through the history bins of the model's cache
    key; workers change it every few seconds).
    """
    sources = []
    with_model = view.sources.get(MODEL_SOURCE) is not None
    for name, value in view.sources.items():
        if name == USAGE_SOURCE or (name == HISTORY_SOURCE and with_model):
            continue
        sources.append((name, getattr(value, "profiles", value) if name == "profiles"
                        else _Same(value)))
    return (view.stage, view.split, view.fresh, view.live_queues, tuple(sources))


class _Same:
    """Compares equal only to a wrapper of the very same object."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)


#: A decision derived by score band, as :func:`_band_decision` builds it: (the band's
#: decision, the model's cache key, p50, p90, score, runtime factor).
_Derivation = tuple[Decision, tuple[Any, ...], float, float, float, float]


class Template:
    """One decision, kept to be handed out again with another id and time."""

    __slots__ = ("task", "header_prefix", "counter", "tally", "notes", "routed", "queue",
                 "reason", "charge", "_decision", "_json")
    _decision: Decision | _Derivation | None

    def __init__(self, decision: Decision, charge: tuple[str, str, float],
                 counters: Counters) -> None:
        self.task = decision.task
        self.header_prefix = decision.header_prefix()  # each task adds its decided_at
        self.counter = decision.counter()
        #: Where each task handed this decision counts it (``Counters.tally``).
        self.tally = counters.tally(self.counter)
        self.notes = tuple(decision.notes)
        self.routed = decision.routed
        self.queue = decision.queue or ""
        self.reason = decision.reason
        self.charge = charge
        self._decision = decision
        self._json: tuple[str, str] | None = None

    def derived(self, header_prefix: str, charge: tuple[str, str, float],
                derivation: _Derivation) -> Template:
        """This template for a decision derived from its own by score band: all the same
        but the header (its numbers), the charge and the record, which is built from
        ``derivation`` when first needed (by the refresher, off the publish path)."""
        other = Template.__new__(Template)
        other.task, other.counter, other.tally = self.task, self.counter, self.tally
        other.notes, other.routed, other.queue = self.notes, self.routed, self.queue
        other.reason, other.header_prefix, other.charge = self.reason, header_prefix, charge
        other._decision, other._json = derivation, None
        return other

    def record_parts(self) -> tuple[str, str]:
        """The record's JSON around the task id (encoded once, by the refresher thread
        that ships the first record, not on the publish path)."""
        found = self._json
        if found is None:
            decision = self._decision
            assert decision is not None  # set until the JSON is made
            if isinstance(decision, tuple):
                decision = _band_decision(*decision)
            found = self._json = (decision.record_head(), decision.record_body())
            self._decision = None  # only its JSON is needed from now on
        return found


def _band_decision(prototype: Decision, feature_key: tuple[Any, ...], p50: float, p90: float,
                   score: float, runtime: float) -> Decision:
    """The decision the pipeline would make for a task derived by score band from
    ``prototype``: the same but its prediction, score and runtime factor (the id and the
    times are not part of a template's record)."""
    decision = prototype.for_task("", prototype.decided_at)
    decision.feature_key = feature_key
    decision.predicted_runtime_s, decision.predicted_p90_s = p50, p90
    decision.score = score
    decision.factors = {**(prototype.factors or {}), "runtime": runtime}
    return decision


class Reused:
    """A task's decision copied from a template: what the header, the decision log and
    the counters need, and nothing else (it is built for every such task)."""

    __slots__ = ("template", "task_id", "decided_at")

    def __init__(self, template: Template, task_id: str, decided_at: float) -> None:
        self.template = template
        self.task_id = task_id
        self.decided_at = decided_at

    @property
    def task(self) -> str:
        return self.template.task

    @property
    def origin_at(self) -> float:
        return self.decided_at  # a first publish

    def record_parts(self) -> tuple[str, str]:
        return self.template.record_parts()

    def header(self) -> str:
        at = self.decided_at
        if type(at) is float and at - at == 0.0:  # a finite time.time(): header_json inlined
            return f'{self.template.header_prefix}"decided_at":{at!r}}}'
        return header_json(self.template.header_prefix, at)

    def record_json(self) -> str:
        """Exactly what ``Decision.record_json`` gives for the decision it copies (a first
        publish: ``origin_at`` is the decision time)."""
        head, body = self.template.record_parts()
        return record_json_of(head, self.task_id, body, self.decided_at, self.decided_at)

    def record(self) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.record_json())
        return found


#: What the memo key reads from a view's sources: the tenants above their fair share,
#: the model (None at cold start), the history features by (tenant, task).
_Reads = tuple[frozenset[str], Any, Mapping[tuple[str, str], Any]]
#: A score band's decision made by the pipeline, its template and its header frame.
_Band = tuple[Decision, Template, HeaderFrame]
#: The memo's state for one view (see ``DecisionMemo._state``).
_State = tuple[View | None, Any, dict[tuple[Any, ...], Template],
               dict[tuple[Any, ...], Template], _Reads, dict[tuple[Any, ...], _Band]]
_NO_READS: _Reads = (frozenset(), None, {})


class DecisionMemo:
    """Templates by (task, tenant, tenant note, demoted, split arm, variant, model cache
    key), for one view at a time."""

    def __init__(self, pipeline: Pipeline, counters: Counters | None = None,
                 limit: int = MEMO_LIMIT) -> None:
        self.pipeline = pipeline
        self.counters = counters if counters is not None else Counters()
        stages = {stage.name: stage for stage in pipeline.stages}
        tenants, priority = stages["tenant"], stages["priority"]
        assert isinstance(tenants, TenantStage) and isinstance(priority, PriorityStage)
        visibility = stages.get("visibility")
        assert visibility is None or isinstance(visibility, VisibilityStage)
        self.visibility = visibility
        self.tenants = tenants
        self.kwarg = tenants.kwarg
        self.default_tenant = tenants.default
        self.claimable = tenants.claimable
        self.priority = priority
        self._charges = priority.usage.pending  # where fair-share charges wait (a deque)
        self._rule: SplitRule | None = None
        self.limit = limit
        #: (view, its fingerprint, templates by memo key, the same by outcome key, what
        #: the key reads from its sources, a decision the pipeline made per score band),
        #: swapped as one object so threads never mix two views.
        self._state: _State = (None, None, {}, {}, _NO_READS, {})

    def __len__(self) -> int:
        return len(self._state[2])

    def clear(self) -> None:
        """Forget every kept decision."""
        self._state = (None, None, {}, {}, _NO_READS, {})

    @classmethod
    def for_pipeline(cls, pipeline: Pipeline, counters: Counters | None = None
                     ) -> DecisionMemo | None:
        """A memo, if every stage of ``pipeline`` is a default (pure) one; its reused
        decisions are counted in ``counters``."""
        names = {stage.name for stage in pipeline.stages}
        if not {"tenant", "priority"} <= names:
            return None
        if not all(type(stage) in PURE_STAGES for stage in pipeline.stages):
            return None
        return cls(pipeline, counters)

    def key(self, task: str, task_id: str, msg_headers: Mapping[str, Any], args: Any,
            kwargs: Any, headers: Mapping[str, Any], declared: Mapping[str, Any],
            now: float, parent: str | None, view: View, variant: Any = None
            ) -> tuple[Any, ...] | None:
        """The memo key of a task, computed as the tenant, features and gate stages
        would, straight from Celery's message (``msg_headers``, ``args``, ``kwargs``),
        the caller's ``headers``, the task's declaration and the tenant of the task
        publishing it (``parent``): no Request is built for a task whose decision is
        kept. None if the task or the view rules the memo out."""
        if msg_headers.get("retries") or msg_headers.get("eta") is not None:
            return None
        if "aitp_labels" in headers:
            return None
        rule = None
        if view.stage is _SPLIT:
            rule = self._split_rule(view)
            if rule is None:
                return None
        raw = headers.get("aitp_tenant")
        if raw is None and self.kwarg and type(kwargs) is dict:
            raw = kwargs.get(self.kwarg)
        if raw is None and parent is None:  # the common cases of resolve(), inlined
            tenant, note = self.default_tenant, None
        elif type(raw) is str and raw in self.claimable:
            tenant, note = raw, None
        else:
            tenant, note = self.tenants.resolve(raw, parent)
        # the split's arm, as the gate finds it (its selectors ignore tier and prediction)
        arm = None if rule is None else rule.routes(
            arm_key(task_id, root_id_of(msg_headers)), task, tenant, None)
        state = self._state
        if state[0] is not view:
            state = self._adopt(view)
        demoted_tenants, model, histories = state[4]
        demoted = tenant in demoted_tenants
        if model is None:  # cold start: the estimate depends on (tenant, task) only
            return (task, tenant, note, demoted, arm, variant)
        request_key = model.request_key
        if request_key is None:
            return None
        # the sizes as Request.of_message reads them (inlined: read for every task)
        args_repr, kwargs_repr = msg_headers.get("argsrepr"), msg_headers.get("kwargsrepr")
        return (task, tenant, note, demoted, arm, variant, request_key(
            task, tenant, args, kwargs, len(args_repr) if type(args_repr) is str else None,
            len(kwargs_repr) if type(kwargs_repr) is str else None,
            declared.get("runtime_hint_s"), 0, now, histories.get((tenant, task))))

    def find(self, view: View, key: tuple[Any, ...], task_id: str, now: float
             ) -> Reused | None:
        """The kept decision for ``key``, its fair-share charge made; None if the
        pipeline must decide.

        On a miss with a model, the forests are walked over the key's cache key (as the
        predict stage would) and the decision of an earlier task that got the same
        prediction, kept under the outcome key, is handed out (and kept under ``key``
        too).
        """
        state = self._state
        if state[0] is not view:
            state = self._adopt(view)
        template = state[2].get(key)
        if template is None:
            model = state[4][1]
            if model is None or len(key) <= _CACHE_KEY_AT:
                return None  # cold start: no prediction to look a decision up by
            p50, p90, _hit = model.compiled.predict_key(key[_CACHE_KEY_AT])
            template = state[3].get(self.outcome_key(key, p50, p90))
            if template is None:
                return self._derive(state, view, key, p50, p90, task_id, now)
            _put(state[2], key, template, self.limit)
        self._charges.append(template.charge)
        return Reused(template, task_id, now)

    def _derive(self, state: _State, view: View, key: tuple[Any, ...], p50: float,
                p90: float, task_id: str, now: float) -> Reused | None:
        """A decision for a new prediction, from one the pipeline made for the same
        task, tenant, note, demotion, arm and variant whose score fell in the same band
        (picked the same tier by score alone), and kept like any other; None if there is
        none, or the visibility guard would look at this prediction.

        Past the predict stage, such a task's decision depends on its prediction only
        through the runtime factor, the score and its band, and the fair-share charge:
        profile, tier, steps, route, gate and the explicit-queue fallback follow from
        the band and the key. So it is that decision with the prediction, the score and
        the runtime factor this task gets (computed by the priority stage itself). Only
        what the publish needs is made here: the header (the band's frame with this
        task's numbers) and the charge; the record is built when it is shipped.
        """
        if self.visibility is not None and not self.visibility.passes(p50, p90):
            return None
        priority = self.priority
        scored = priority.rescore(key[0], key[1], p90)
        if scored is None:
            return None
        runtime, score, rank = scored
        band = state[5].get((*key[:_CACHE_KEY_AT], rank))
        if band is None:
            return None
        prototype, template, frame = band
        derived = template.derived(
            prefix_of(frame, p50, p90, score),
            priority.charge_for(prototype.tenant, prototype.tier, p50),
            (prototype, key[_CACHE_KEY_AT], p50, p90, score, runtime))
        self._hold(state, key, derived, self.outcome_key(key, p50, p90))
        self._charges.append(derived.charge)  # as the priority stage would
        return Reused(derived, task_id, now)

    def make(self, request: Request, view: View, key: tuple[Any, ...],
             finish: Callable[[Decision], None] | None = None) -> Decision | Reused:
        """The pipeline's decision for a task :meth:`find` found none for, kept if it
        may be. ``finish`` adjusts it (the explicit-queue fallback, say) before it is
        kept; the key's ``variant`` must be all ``finish`` depends on besides it."""
        decision = self.pipeline.decide(request, view, request.published_at,
                                        self.feature_key(key))
        if finish is not None:
            finish(decision)
        kept = self.keep(view, key, decision)
        if kept is None:
            return decision
        self._keep_band(view, key, decision, kept.template)
        return kept

    def _split_rule(self, view: View) -> SplitRule | None:
        """The view's split, compiled once; None if its selectors look at the decision."""
        rule = self._rule
        if rule is None or rule.source is not view.split:
            rule = self._rule = SplitRule(view.split)
        return None if rule.tiers or rule.max_uncertainty is not None else rule

    @staticmethod
    def feature_key(key: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """The model's cache key inside a memo key (None at cold start), so the features
        stage need not compute it again on a miss."""
        return key[_CACHE_KEY_AT] if len(key) > _CACHE_KEY_AT else None

    @staticmethod
    def outcome_key(key: tuple[Any, ...], p50: float | None, p90: float | None
                    ) -> tuple[Any, ...]:
        """The memo key with the prediction in place of the model's cache key."""
        return (*key[:_CACHE_KEY_AT], p50, p90)

    def _adopt(self, view: View) -> _State:
        """Move the memo to a new view: its templates stay if the view's fingerprint is
        the same as the last one's (once per view, not per publish), and what the key
        reads from its sources is looked up once."""
        _, fingerprint, templates, outcomes, _, bands = self._state
        found = view_fingerprint(view)
        if found != fingerprint:
            templates, outcomes, bands = {}, {}, {}
        sources = view.sources
        usage = sources.get(USAGE_SOURCE)
        reads: _Reads = (frozenset() if usage is None else usage.demoted,
                         sources.get(MODEL_SOURCE),
                         sources.get(HISTORY_SOURCE, EMPTY_HISTORY).features)
        state: _State = (view, found, templates, outcomes, reads, bands)
        self._state = state
        return state

    def keep(self, view: View, key: tuple[Any, ...], decision: Decision) -> Reused | None:
        """Keep a decision the pipeline just made for an eligible task under ``view``;
        the decision itself as a Reused (its header built once), or None if not kept."""
        notes = decision.notes
        if decision.reason in VISIBILITY_REASONS or \
                (notes and not VISIBILITY_REASONS.isdisjoint(notes)):
            return None  # the guard's warning is rate-limited per publish: decide each time
        state = self._state
        if state[0] is not view:
            return None  # the view changed meanwhile
        template = Template(decision, self.priority.charge_of(decision), self.counters)
        by_outcome = decision.feature_key is not None and decision.prediction_source == "model"
        self._hold(state, key, template, self.outcome_key(
            key, decision.predicted_runtime_s, decision.predicted_p90_s) if by_outcome else None)
        return Reused(template, decision.task_id, decision.decided_at)

    def _hold(self, state: _State, key: tuple[Any, ...], template: Template,
              outcome: tuple[Any, ...] | None) -> None:
        """Keep ``template`` under ``key`` and, with a model's prediction, its outcome key."""
        _put(state[2], key, template, self.limit)
        if outcome is not None:
            _put(state[3], outcome, template, self.limit)

    def _keep_band(self, view: View, key: tuple[Any, ...], decision: Decision,
                   template: Template) -> None:
        """Keep a decision the pipeline made (with a model) and its template as its score
        band's, for :meth:`_derive`, unless the band has one already."""
        state = self._state
        if state[0] is not view or decision.score is None or decision.factors is None or \
                decision.prediction_source != "model":
            return
        band = (*key[:_CACHE_KEY_AT], self.priority.rank_of(decision.score))
        if band not in state[5]:
            _put(state[5], band, (decision, template, decision.header_frame()), self.limit)


_Kept = TypeVar("_Kept")


def _put(kept: dict[tuple[Any, ...], _Kept], key: tuple[Any, ...], value: _Kept,
         limit: int) -> None:
    """Keep ``value`` under ``key``, starting over when ``limit`` are kept."""
    if len(kept) >= limit:
        kept.clear()
    kept[key] = value
