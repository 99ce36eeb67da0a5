"""What the publish path knows about a task (Request) and what it decides (Decision).

Both are plain slotted classes, not pydantic models: they are built for every task and
must cost well under a microsecond. Stages fill a Decision in, in pipeline order.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from json.encoder import encode_basestring_ascii as _quote
from typing import Any

from celery_aitp.numbers import compact_json as _ENCODE
from celery_aitp.numbers import finite_number, json_number

#: Bump when the ``aitp`` header changes shape; readers accept older versions. 2: one
#: compact JSON object in a string (1: a mapping, which kombu's JSON and py-amqp's
#: header-table encoders took 3 to 6 us more per publish to write).
HEADER_VERSION = 2
#: Bump when a decision record changes shape.
RECORD_VERSION = 1
#: ``prediction_source`` of a runtime model's prediction (the others are history
#: estimates or a declared hint): placement ranks it by the policy's quantile.
MODEL_PREDICTION = "model"
#: Longest ``aitp`` header text read back (a decision's is about 350 characters).
MAX_HEADER_CHARS = 4096
#: The reason of a task someone routed (``queue=``, or a retry, which Celery sends back to
#: the tier queue it came from) that keeps its queue: neither placed by us nor a fallback.
EXPLICIT_QUEUE = "explicit_queue"


def decision_outcome(reason: str) -> str:
    """``routed``, ``explicit`` (it kept the queue someone named) or ``fallback``: what a
    decision's reason says happened (metrics, dashboard and the stage guard agree)."""
    if reason == "routed":
        return "routed"
    return "explicit" if reason == EXPLICIT_QUEUE else "fallback"



class Request:
    """A task about to be published, as Celery hands it to us."""

    __slots__ = (
        "task", "task_id", "args", "kwargs", "headers", "declared",
        "explicit_queue", "published_at", "retries", "root_id", "args_bytes", "kwargs_bytes",
        "parent_tenant", "eta",
    )

    def __init__(
        self,
        task: str,
        task_id: str,
        args: Any = (),
        kwargs: Any = None,
        headers: Mapping[str, Any] | None = None,
        declared: Mapping[str, Any] | None = None,
        explicit_queue: str | None = None,
        published_at: float = 0.0,
        retries: int = 0,
        root_id: str | None = None,
        args_bytes: int | None = None,
        kwargs_bytes: int | None = None,
        parent_tenant: str | None = None,
        eta: str | None = None,
    ) -> None:
        self.task = task
        self.task_id = task_id
        self.args = args
        self.kwargs = kwargs if kwargs is not None else {}
        self.headers = headers if headers is not None else {}
        self.declared = declared if declared is not None else {}
        self.explicit_queue = explicit_queue
        self.published_at = published_at
        self.retries = retries
        self.root_id = root_id  # the workflow's first task (chains, chords); None if alone
        #: Lengths of Celery's ``argsrepr``/``kwargsrepr`` headers: a free size proxy.
        self.args_bytes = args_bytes
        self.kwargs_bytes = kwargs_bytes
        # tenant of the task running in this worker process, if this one is published
        # from inside it (a chain step, a chord body, a sub-task); already validated
        self.parent_tenant = parent_tenant
        self.eta = eta  # Celery's ISO-8601 ``eta`` header (countdown too); None if unset


    @classmethod
    def of_message(cls, task: str, task_id: str, msg_headers: Mapping[str, Any], args: Any,
                   kwargs: Any, headers: Mapping[str, Any], declared: Mapping[str, Any],
                   explicit_queue: str | None, published_at: float, parent_tenant: str | None
                   ) -> Request:
        """A Request from the headers of Celery's task message (protocol 2) and the rest;
        fields of the wrong type read as absent."""
        args_repr, kwargs_repr = msg_headers.get("argsrepr"), msg_headers.get("kwargsrepr")
        return cls(task, task_id, args, kwargs, headers, declared, explicit_queue,
                   published_at, msg_headers.get("retries") or 0, root_id_of(msg_headers),
                   len(args_repr) if type(args_repr) is str else None,
                   len(kwargs_repr) if type(kwargs_repr) is str else None,
                   parent_tenant, msg_headers.get("eta"))


def root_id_of(msg_headers: Mapping[str, Any]) -> str | None:
    """The workflow's first task id from Celery's message headers; None if alone."""
    root = msg_headers.get("root_id")
    return root if type(root) is str and root else None


def read_header(raw: Any) -> Mapping[str, Any] | None:
    """An ``aitp`` header as a mapping: a v2 text parsed, a v1 mapping as it is; None for
    anything else (too long, not JSON, not an object). Never raises: anyone who can
    publish can write any header, so readers check each field they use."""
    if isinstance(raw, Mapping):
        return raw
    if type(raw) is bytes:
        raw = raw.decode("utf-8", "replace")
    if type(raw) is not str or len(raw) > MAX_HEADER_CHARS:
        return None
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return doc if type(doc) is dict else None


def header_origin(raw: Any) -> float | None:
    """When the task of an ``aitp`` header was first published: ``origin_at``, else
    ``decided_at`` (a first publish leaves ``origin_at`` out); None unless one of them is
    a positive finite number. Never raises, whatever the header holds."""
    header = read_header(raw)
    if header is None:
        return None
    try:
        for field in ("origin_at", "decided_at"):
            value = finite_number(header.get(field))
            if value is not None and value > 0:
                return value
    except Exception:  # a mapping whose reads raise: as if it held nothing
        return None
    return None


class Decision:
    """The route chosen for one task, and why. Becomes the ``aitp`` message header."""

    __slots__ = (
        "task", "task_id", "tenant", "tier", "accelerator", "features", "predicted_runtime_s",
        "predicted_p90_s", "prediction_source", "profile", "score", "factors",
        "queue", "routed", "reason", "stage", "arm", "decided_at", "notes",
        "tier_steps", "origin_at", "feature_key", "counter_tenant",
    )

    def __init__(self, stage: str, decided_at: float, task: str = "", task_id: str = "") -> None:
        self.task = task
        self.task_id = task_id
        self.tenant: str = ""
        self.tier: str = ""
        self.accelerator: str = ""
        #: Feature vector of the model in use (names: ``model.spec.names``); () without one.
        self.features: tuple[Any, ...] = ()
        #: The model's cache key, when the features stage computes it without the vector.
        self.feature_key: tuple[Any, ...] | None = None
        self.predicted_runtime_s: float | None = None
        self.predicted_p90_s: float | None = None
        self.prediction_source: str | None = None
        self.profile: dict[str, Any] | None = None
        self.score: float | None = None
        self.factors: dict[str, float] | None = None
        self.queue: str | None = None  # the tier queue chosen (or that would be, in shadow)
        self.routed: bool = False
        self.reason: str = "undecided"
        self.stage: str = stage
        self.arm: str | None = None  # 'routed' or 'standard' in the split stage
        self.decided_at: float = decided_at
        self.notes: list[str] = []  # counted anomalies, e.g. 'tenant_unknown'
        #: The tenant its counter names, when not ``tenant``: a tenant of a class (listed
        #: or not) is counted under its class, so the store's counters grow with queue
        #: owners, not with tenants.
        self.counter_tenant: str | None = None
        self.tier_steps: dict[str, Any] | None = None  # how the score became the tier
        self.origin_at: float | None = None  # first publish of this task (kept by retries)

    def fall_back(self, reason: str) -> Decision:
        """Send the task down Celery's own path, keeping what was decided for the record."""
        self.routed = False
        self.reason = reason
        return self

    def counter(self) -> str:
        """Its ``decisions:<stage>:<tenant>:<tier>:<accelerator>:<reason>`` counter (bounded
        by the policy; the reason goes last because ``error:<Type>`` holds the separator)."""
        return (f"decisions:{self.stage}:{self.counter_tenant or self.tenant}:{self.tier}:"
                f"{self.accelerator}:{self.reason}")

    def header(self) -> str:
        """The ``aitp`` header carried by the message: one compact, strict JSON object.

        Always: v, tenant, tier, accelerator, predicted_runtime_s (null when unknown),
        stage, routed, queue, reason, decided_at. Optional fields (predicted_p90_s,
        prediction_source, arm, score, origin_at) are left out when unset, and origin_at
        also when it equals decided_at (a first publish): every byte is encoded on each
        publish. Readers use :func:`read_header` and ``header.get(field)`` (``origin_at
        or decided_at``); a worker hands its task the mapping as ``self.request.aitp``.
        """
        return header_json(self.header_prefix(), self.decided_at)

    def header_prefix(self) -> str:
        """The header's JSON before ``decided_at`` (ending in a comma): all of it that
        does not depend on the time (:func:`header_json` puts it together)."""
        shared = _ENCODE({"tenant": self.tenant, "tier": self.tier,
                          "accelerator": self.accelerator, "stage": self.stage,
                          "routed": self.routed, "queue": self.queue,
                          "reason": self.reason})[1:-1]
        p50 = self.predicted_runtime_s
        parts = [f'{{"v":{HEADER_VERSION},{shared},"predicted_runtime_s":']
        if p50 is None:
            parts.append("null,")
        else:
            parts.append(f'{json_number(p50)},"predicted_p90_s":'
                         f'{json_number(self.predicted_p90_s)},"prediction_source":'
                         f'{_ENCODE(self.prediction_source)},')
        if self.arm is not None:
            parts.append(f'"arm":{_ENCODE(self.arm)},')
        if self.score is not None:
            parts.append(f'"score":{json_number(self.score)},')
        origin = self.origin_at
        if origin is not None and origin != self.decided_at:  # a retry's first publish
            parts.append(f'"origin_at":{json_number(origin)},')
        return "".join(parts)

    def record(self) -> dict[str, Any]:
        """The decision as stored for comparison and ``explain`` (every field, even unset).

        Built by the refresher thread when it ships records, not on the publish path.
        """
        return {
            "v": RECORD_VERSION,
            "task": self.task,
            "task_id": self.task_id,
            "tenant": self.tenant,
            "tier": self.tier,
            "accelerator": self.accelerator,
            "predicted_runtime_s": self.predicted_runtime_s,
            "predicted_p90_s": self.predicted_p90_s,
            "prediction_source": self.prediction_source,
            "stage": self.stage,
            "routed": self.routed,
            "queue": self.queue,
            "reason": self.reason,
            "arm": self.arm,
            "score": self.score,
            "factors": self.factors,
            "profile": self.profile,
            "tier_steps": self.tier_steps,
            "notes": self.notes,  # what explain tells besides the steps (a refused tenant)
            "decided_at": self.decided_at,
            "origin_at": self.origin_at,
        }

    def record_json(self) -> str:
        """``record()`` as compact JSON, built about four times faster than encoding it.

        The fields many decisions share (task, tenant, tier, queue, reason, ...) are
        encoded once per distinct combination, and so are the stages' shared details;
        only the id, the numbers and the factors are encoded per decision. Decodes to
        exactly ``record()``.
        """
        return record_json_of(self.record_head(), self.task_id, self.record_body(),
                              self.decided_at, self.origin_at)

    def record_parts(self) -> tuple[str, str]:
        """(``record_head()``, ``record_body()``): the record without id and times."""
        return self.record_head(), self.record_body()

    def record_head(self) -> str:
        """The start of the record's JSON: ``{"v":1`` and the fields before the task id
        (:func:`record_json_of` puts it together)."""
        shared = _ENCODE({"task": self.task, "tenant": self.tenant, "tier": self.tier,
                          "accelerator": self.accelerator,
                          "prediction_source": self.prediction_source, "stage": self.stage,
                          "routed": self.routed, "queue": self.queue, "reason": self.reason,
                          "arm": self.arm})[1:-1]
        return f'{{"v":{RECORD_VERSION},{shared}'

    def record_body(self) -> str:
        """The record's JSON from the prediction to the tier steps (``,"predicted_..."``);
        what follows is ``decided_at`` and ``origin_at``."""
        return (f',"predicted_runtime_s":{json_number(self.predicted_runtime_s)},'
                f'"predicted_p90_s":{json_number(self.predicted_p90_s)},'
                f'"score":{json_number(self.score)},'
                f'"factors":{_ENCODE(self.factors)},'
                f'"profile":{_ENCODE(self.profile)},"tier_steps":{_ENCODE(self.tier_steps)},'
                f'"notes":{_ENCODE(self.notes)}')


def header_json(prefix: str, decided_at: Any) -> str:
    """An ``aitp`` header from :meth:`Decision.header_prefix` and the decision time."""
    return f'{prefix}"decided_at":{json_number(decided_at)}}}'


def record_json_of(head: str, task_id: str, body: str, decided_at: Any, origin_at: Any) -> str:
    """A record's JSON from :meth:`Decision.record_head` and :meth:`Decision.record_body`
    (which do not depend on the task id or the time) and the fields that do."""
    at_s = json_number(decided_at)
    origin_s = at_s if origin_at is decided_at else json_number(origin_at)
    return (f'{head},"task_id":{_quote(task_id)}{body},"decided_at":{at_s},'
            f'"origin_at":{origin_s}}}')


def runtime_hint(declared: Mapping[str, Any]) -> float | None:
    """The task's declared ``runtime_hint_s`` if it is a positive finite number, else None
    (the prediction, placement and spill stages read it alike)."""
    hint = finite_number(declared.get("runtime_hint_s"))
    return hint if hint is not None and hint > 0 else None
