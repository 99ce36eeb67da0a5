"""Hand a whole decision out again to the tasks that would get the very same one.

The pipeline's head (tenant, features, predict) runs for every task: it is cheap, and its
results are what differ from task to task. The tail (profile, priority, route, gate,
visibility) places the task; each tail stage states what its result depends on besides
the head's results and the view (its ``memo_key``), or that it cannot vouch for a task (a
retry's age, an ETA, a labels header read per publish). So between two views that look
the same to the tail (:func:`view_fingerprint`), the tail's result is a function of the
memo key (:meth:`Pipeline.key <celery_aitp.publish.pipeline.Pipeline.key>`): the first
task of a key runs the tail, and its decision is kept as a :class:`Template` (the
``aitp`` header, the record's JSON without the id and the time, the counter, the
fair-share charge and the route); the next task with the same key gets a :class:`Reused`
(the template with its own id and time) instead of the tail, a Decision and its record
encoding: the same header, record, counters and route at a fraction of the cost.

A task someone routed (``queue=``, a ``task_routes`` match) keeps its queue; its decision
is the pipeline's with the explicit-queue fallback applied, which depends only on whether
that queue is a tier queue and, if so, whether a live worker serves it. Those two facts,
the *variant*, join the key (None for a task nobody routed).

No decision outlives the state it was made on: the memo belongs to one view, and a new
view keeps it only if its fingerprint is the same. A decision the visibility guard
flagged is never kept (its warning is rate-limited per publish). A pipeline holding a
tail stage without ``memo_key`` does not use the memo.

Tenants of a class share one decision per class identity
(:mod:`celery_aitp.publish.tenant_share`): a new tenant of a class gets a copy with its
own name and fair-share charge instead of running the tail.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NamedTuple

from celery_aitp.cache import BoundedDict
from celery_aitp.core.request import Decision, Request, header_json, record_json_of
from celery_aitp.core.view import View
from celery_aitp.publish.pipeline import Pipeline
from celery_aitp.publish.priority_stage import Charge, PriorityStage
from celery_aitp.publish.tenant_share import ClassShare
from celery_aitp.publish.visibility_stage import VISIBILITY_REASONS
from celery_aitp.telemetry.counters import Counters

#: Templates kept before the memo starts over (about a kilobyte each).
MEMO_LIMIT = 10_000


def view_fingerprint(view: View, sources: frozenset[str]) -> tuple[Any, ...]:
    """What the tail reads from a view as a whole, comparable with ``==``: the stage,
    the split, freshness, the live queues and the tail's ``sources``.

    Sources compare by identity (a source hands out the same object until it changes),
    except the profile book, rebuilt on every fetch: by its profiles (frozen, compared by
    value).
    """
    values = tuple(
        (name, getattr(value, "profiles", value) if name == "profiles" else _Same(value))
        for name, value in view.sources.items() if name in sources)
    return (view.stage, view.split, view.fresh, view.live_queues, values)


class _Same:
    """Compares equal only to a wrapper of the very same object."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)


class _Kept(NamedTuple):
    """The templates kept for one view, swapped as one object so that threads never mix
    two views."""

    view: View | None
    fingerprint: Any
    templates: BoundedDict[tuple[Any, ...], Template]


class Template:
    """One decision, kept to be handed out again with another id and time."""

    __slots__ = ("task", "header_prefix", "counter", "tally", "notes", "routed", "queue",
                 "reason", "charges", "_decision", "_json")

    def __init__(self, decision: Decision, charges: tuple[Charge, ...],
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
        self.charges = charges  # what the priority stage adds per task
        self._decision: Decision | None = decision
        self._json: tuple[str, str] | None = None

    def record_parts(self) -> tuple[str, str]:
        """The record's JSON around the task id (encoded once, by the refresher thread
        that ships the first record, not on the publish path)."""
        found = self._json
        if found is None:
            decision = self._decision
            assert decision is not None  # set until the JSON is made
            found = self._json = decision.record_parts()
            self._decision = None  # only its JSON is needed from now on
        return found


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
        return header_json(self.template.header_prefix, self.decided_at)

    def record_json(self) -> str:
        """Exactly what ``Decision.record_json`` gives for the decision it copies (a first
        publish: ``origin_at`` is the decision time)."""
        head, body = self.template.record_parts()
        return record_json_of(head, self.task_id, body, self.decided_at, self.decided_at)

    def record(self) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.record_json())
        return found


class DecisionMemo:
    """Templates by memo key and explicit-queue variant, for one view at a time."""

    def __init__(self, pipeline: Pipeline, counters: Counters | None = None,
                 limit: int = MEMO_LIMIT) -> None:
        self.pipeline = pipeline
        self.counters = counters if counters is not None else Counters()
        priority = next(s for s in pipeline.tail if s.name == "priority")
        assert isinstance(priority, PriorityStage)
        self.priority = priority
        #: Decisions shared by the tenants of a class (one tail run per class, not per
        #: tenant); None when the policy has no classes.
        policy = priority.policy
        self.share = ClassShare(policy) if policy.tenant_classes else None
        self._sources = pipeline.tail_view_sources()
        self.limit = limit
        self._kept = _Kept(None, None, BoundedDict(limit))

    def __len__(self) -> int:
        return len(self._kept.templates)

    def clear(self) -> None:
        """Forget every kept decision."""
        self._kept = _Kept(None, None, BoundedDict(self.limit))

    @classmethod
    def for_pipeline(cls, pipeline: Pipeline, counters: Counters | None = None
                     ) -> DecisionMemo | None:
        """A memo, if every tail stage of ``pipeline`` states its ``memo_key`` and the
        priority stage (which charges fair share) is a default one; else None."""
        if not pipeline.memoizable or not any(
                isinstance(s, PriorityStage) for s in pipeline.tail):
            return None
        return cls(pipeline, counters)

    def decide(self, request: Request, view: View, now: float, variant: Any = None,
               finish: Callable[[Decision], None] | None = None) -> Decision | Reused:
        """The decision for ``request``: a kept one if its key has one, else the
        pipeline's (kept for the next task of its key when it may be). ``finish``
        adjusts a decision the pipeline made (the explicit-queue fallback) before it is
        kept; ``variant`` must be all ``finish`` depends on besides the decision."""
        pipeline = self.pipeline
        decision = pipeline.start(request, view, now)
        key = pipeline.key(request, decision, view)
        if key is None:
            return self._finish(request, decision, view, finish)
        key += (variant,)
        templates = self._templates(view)
        template = templates.get(key)
        share = self.share
        if template is None and share is not None:
            renamed = share.find(key, decision, view, templates)
            if renamed is not None:  # another tenant's of the same class identity
                template = templates.put(key, self._template(renamed))
        if template is not None:
            for charge in template.charges:  # as the priority stage would
                charge.pending.append(charge.item)
            return Reused(template, request.task_id, now)
        self._finish(request, decision, view, finish)
        if decision.reason in VISIBILITY_REASONS or \
                not VISIBILITY_REASONS.isdisjoint(decision.notes):
            return decision  # the guard's warning is rate-limited per publish: decide each time
        template = templates.put(key, self._template(decision))
        if share is not None:
            share.keep(key, decision, view, templates)
        return Reused(template, decision.task_id, decision.decided_at)

    def _template(self, decision: Decision) -> Template:
        """A decision kept for its key's next tasks, with what it charges per task."""
        return Template(decision, self.priority.charges_of(decision), self.counters)

    def _finish(self, request: Request, decision: Decision, view: View,
                finish: Callable[[Decision], None] | None) -> Decision:
        self.pipeline.finish(request, decision, view)
        if finish is not None:
            finish(decision)
        return decision

    def _templates(self, view: View) -> BoundedDict[tuple[Any, ...], Template]:
        """The templates kept for ``view``: those of the last view if it looked the same
        to the tail (compared once per view, not per publish), else none."""
        kept = self._kept
        if kept.view is view:
            return kept.templates
        found = view_fingerprint(view, self._sources)
        templates = kept.templates if found == kept.fingerprint else BoundedDict(self.limit)
        self._kept = _Kept(view, found, templates)
        return templates
