"""Record what each run really cost, from Celery's task signals, inside the pool child.

A record is built in memory and put in a bounded buffer; the background refresher
writes it to the store's capped observation stream (``observation_maxlen`` records) and
adds the run to the per-(tenant, task) history summary. A store outage drops records
(and counts the drops); it never delays or fails a task. The record's fields are the
observation schema in docs/prediction.md, which is also the JSON-lines format ``train`` reads.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import socket
import time
from collections.abc import Mapping
from typing import Any

from celery import signals

from celery_aitp.core.request import read_header
from celery_aitp.errors import PolicyError
from celery_aitp.numbers import finite_number, skewed_wait
from celery_aitp.predict.drift import DriftSink
from celery_aitp.predict.features import argument_features, call_signature, magnitude_class
from celery_aitp.predict.history import HistorySink
from celery_aitp.queues import parse_tier_queue
from celery_aitp.worker.ledger import RunLedger
from celery_aitp.worker.meter import RunMeter, make_probe

logger = logging.getLogger(__name__)

#: Largest JSON rendering of args/kwargs kept in a record; larger values are summarised.
MAX_ARGS_BYTES = 2048
#: Version of the observation record layout (bumped when a field changes meaning).
RECORD_VERSION = 1
_HOST = socket.gethostname()


def safe_json(value: Any, limit: int = MAX_ARGS_BYTES) -> Any:
    """``value`` as JSON will hold it (objects as their repr) if small, else a short
    summary; never raises, and the result is plain JSON data (nothing left to convert
    when the record is shipped)."""
    try:
        text = json.dumps(value, default=repr, allow_nan=False)
    except Exception:  # NaN, cycles, too deep, or an object whose repr raises
        return {"_unserializable": type(value).__name__}
    if len(text) > limit:
        return {"_truncated": type(value).__name__, "bytes": len(text)}
    return json.loads(text)  # objects json.dumps only rendered become their repr


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _json_features(args: Any, kwargs: Any, request: Any) -> dict[str, Any]:
    """Argument features of the real arguments (missing values as null, for JSON)."""
    features = argument_features(
        args, kwargs, _repr_length(getattr(request, "argsrepr", None)),
        _repr_length(getattr(request, "kwargsrepr", None)))
    return {k: (None if v != v else v) for k, v in features.items()}


def _repr_length(text: Any) -> int | None:
    return len(text) if isinstance(text, str) else None


#: ``aitp`` header fields a record keeps, by the type they must have.
_TEXT_FIELDS = ("tenant", "tier", "accelerator", "reason", "stage", "arm",
                "prediction_source", "queue")
_NUMBER_FIELDS = ("decided_at", "predicted_runtime_s", "predicted_p90_s")
#: Longest header text kept (queue names and reasons are far shorter).
MAX_HEADER_TEXT = 256
#: Largest magnitude of a header number kept (times and runtimes are far smaller).
MAX_HEADER_NUMBER = 1e300


def _raw_header(request: Any) -> dict[str, Any]:
    raw = getattr(request, "aitp", None)
    if raw is None and isinstance(getattr(request, "headers", None), dict):
        raw = request.headers.get("aitp")
    header = read_header(raw)
    return header if type(header) is dict else {}


def checked_header(raw: Mapping[str, Any], tenants: Any) -> tuple[dict[str, Any], list[str]]:
    """The ``aitp`` header fields a record may keep, and the names of those rejected.

    The header arrives with the message, so anyone who can publish can forge it: texts
    must be short strings (the tenant one of the policy's), numbers finite, ``routed`` a
    bool. A rejected field is recorded as null.
    """
    out: dict[str, Any] = {}
    bad: list[str] = []
    for name in _TEXT_FIELDS:
        value = raw.get(name)
        if value is None or (value == "" and name == "tenant"):
            continue  # no tenant: a misconfigured producer's header (config_error)
        if type(value) is str and len(value) <= MAX_HEADER_TEXT and (
                name != "tenant" or value in tenants):
            out[name] = value
        else:
            bad.append(name)
    for name in _NUMBER_FIELDS:
        value = raw.get(name)
        if value is None:
            continue
        if type(value) in (int, float) and -MAX_HEADER_NUMBER < value < MAX_HEADER_NUMBER:
            out[name] = value  # compared, not converted: a huge int cannot raise, NaN fails
        else:
            bad.append(name)
    routed = raw.get("routed")
    if type(routed) is bool:
        out["routed"] = routed
    elif routed is not None:
        bad.append("routed")
    return out, bad


def record_run(ledger: RunLedger, history: HistorySink, record: Mapping[str, Any],
               drift: DriftSink | None = None) -> None:
    """What a worker does with a finished run besides shipping its record: the run ledger
    (profiles, observed usage) and, for a success, the history summary and (when the
    model predicted it) the task's live prediction error. The replay simulator's workers
    call it too."""
    ledger.add(record)
    if record.get("outcome") == "SUCCESS" and record.get("tenant"):
        arguments = record.get("features")
        if not isinstance(arguments, Mapping):
            arguments = argument_features(record.get("args"), record.get("kwargs"))
        history.add(record["tenant"], record["task"], record["runtime_s"],
                    magnitude_class(record.get("args"), record.get("kwargs")),
                    call_signature(arguments))
        if drift is not None and record.get("prediction_source") == "model":
            drift.add(record["task"], record["runtime_s"], record.get("predicted_runtime_s"))


class Observer:
    """Signal handlers for one app; ignores tasks of other apps."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._started: dict[str, tuple[float, float, float]] = {}
        self._pid = 0  # the meter, ledger and history sink belong to one (pool) process
        self._meter: RunMeter | None = None
        self._ledger: RunLedger | None = None
        self._history: HistorySink | None = None
        self._drift: DriftSink | None = None
        #: Accelerator class of this worker (set by the worker step; None if unflagged).
        self.accelerator: str | None = None
        self._reported: set[str] = set()  # header fields whose rejection was logged

    def _parts(self) -> tuple[RunMeter, RunLedger, HistorySink]:
        """Per-run meter, run ledger and history sink of this process, built on its first
        task (a forked child starts its own: the parent's pending runs are not its)."""
        if (self._meter is None or self._ledger is None or self._history is None
                or self._pid != os.getpid()):
            if self._ledger is not None:
                self._ledger.take()  # a forked copy of the parent's: its runs are not ours
            mw = self.app.aitp
            settings = mw.settings
            self._meter = RunMeter(make_probe(settings.accelerator_probe),
                                   settings.per_run_memory)
            self._ledger = RunLedger(mw.policy, mw.counters)
            mw.live.add_flusher(self._ledger.flush)
            self._history = HistorySink(mw.counters)
            mw.live.add_flusher(self._history.flush)
            self._drift = DriftSink(mw.counters)
            mw.live.add_flusher(self._drift.flush)
            self._pid = os.getpid()
        return self._meter, self._ledger, self._history

    def prerun(self, task_id: str | None = None, task: Any = None, **_: Any) -> None:
        if task is None or task.app is not self.app or task_id is None:
            return
        try:
            self.app.aitp.live.current()  # make sure this process ships its records
        except Exception:
            logger.debug("aitp: live view unavailable in worker", exc_info=True)
        try:
            self._parts()[0].start(task_id)
        except Exception:
            logger.debug("aitp: run meter unavailable", exc_info=True)
        self._started[task_id] = (time.time(), time.perf_counter(), _cpu_seconds())

    def postrun(self, task_id: str | None = None, task: Any = None, state: str | None = None,
                args: Any = None, kwargs: Any = None, **_: Any) -> None:
        started = self._started.pop(task_id, None) if task_id else None
        if started is None or task is None:
            return
        try:
            meter, ledger, history = self._parts()
            measures = meter.stop(task_id or "")
            record = self._record(task, task_id or "", state, args, kwargs, started)
            record.update(measures)
            mw = self.app.aitp
            self._check_wait(mw, record.get("wait_s"))
            self._check_visibility(mw, record)
            mw.live.buffer(mw.store.keys.observations).add(record)
            record_run(ledger, history, record, self._drift)
        except Exception:  # recording must never fail a task
            self.app.aitp.counters.incr("observations_failed")
            logger.debug("aitp: could not record run of %s", task_id, exc_info=True)

    def _check_wait(self, mw: Any, wait: Any) -> None:
        """Count a run whose wait is negative beyond the tolerance (``clock_skew``): the
        producer's clock is ahead of this worker's, so its wait is unknown (readers
        leave it out of waits and SLA hits); the record keeps it, the size of the skew."""
        wait = finite_number(wait)
        if wait is None or not skewed_wait(wait):
            return
        mw.counters.incr("clock_skew")
        if "clock_skew" not in self._reported:
            self._reported.add("clock_skew")
            logger.warning("aitp: a run started %.1f s before it was decided: the clocks of "
                           "its producer and this worker differ (keep them NTP-synced); "
                           "such runs count as clock_skew, their wait unknown", -wait)

    def _check_visibility(self, mw: Any, record: Mapping[str, Any]) -> None:
        """Count a run from a Redis tier queue that outlasted ``visibility_timeout``
        (``visibility_exceeded``): a strict worker acknowledges such a delivery after the
        run, so Redis handed it out again meanwhile and it may have run twice. The
        producers' visibility guard flags the task once its runs are in the history; a
        task with no history had no prediction to flag it by."""
        queue = record.get("queue")
        runtime = finite_number(record.get("runtime_s"))
        if runtime is None or not isinstance(queue, str) or parse_tier_queue(queue) is None:
            return
        try:
            limit = mw.visibility_timeout_s  # None: not Redis
        except PolicyError:  # a bad timeout: said by the producers' guard
            return
        if limit is None or runtime <= limit:
            return
        mw.counters.incr("visibility_exceeded")
        task = str(record.get("task"))
        if f"visibility:{task}" not in self._reported and len(self._reported) < 1000:
            self._reported.add(f"visibility:{task}")
            logger.warning("aitp: %s ran %.0f s from tier queue %s, longer than the Redis "
                           "visibility_timeout (%.0f s): the broker may have handed it to "
                           "another worker meanwhile, so it may have run twice. Raise "
                           "broker_transport_options['visibility_timeout'] above its "
                           "longest run (docs/brokers.md); counted as visibility_exceeded",
                           task, runtime, queue, limit)

    def _header(self, request: Any) -> dict[str, Any]:
        """The checked ``aitp`` header; each rejected field counted and logged once."""
        mw = self.app.aitp
        header, bad = checked_header(_raw_header(request), mw.tenant_names)
        for name in bad:
            mw.counters.incr(f"rejected:aitp_header:{name}")
            if name not in self._reported:
                self._reported.add(name)
                logger.warning("aitp: ignoring a malformed %r in the aitp header of a "
                               "message (recorded as null; counted as "
                               "rejected:aitp_header:%s)", name, name)
        return header

    def _record(self, task: Any, task_id: str, state: str | None, args: Any, kwargs: Any,
                started: tuple[float, float, float]) -> dict[str, Any]:
        start_wall, start_perf, start_cpu = started
        runtime = time.perf_counter() - start_perf
        request = task.request
        header = self._header(request)
        delivery = getattr(request, "delivery_info", None)
        delivery = delivery if type(delivery) is dict else {}
        routing_key = delivery.get("routing_key")
        hostname = getattr(request, "hostname", None)
        retries = getattr(request, "retries", 0)
        decided_at = header.get("decided_at")
        ready_at = _eta_seconds(getattr(request, "eta", None)) or decided_at
        declared = getattr(task, "aitp", None)
        hint = declared.get("runtime_hint_s") if type(declared) is dict else None
        if not ((type(hint) is int or type(hint) is float)
                and -MAX_HEADER_NUMBER < hint < MAX_HEADER_NUMBER):
            hint = None
        call_args = list(args) if isinstance(args, (list, tuple)) else []
        call_kwargs = kwargs if isinstance(kwargs, dict) else {}
        return {
            "v": RECORD_VERSION,
            "task": task.name,
            "task_id": task_id,
            "tenant": header.get("tenant"),
            "tier": header.get("tier"),
            "accelerator": header.get("accelerator"),
            "routed": header.get("routed"),
            "reason": header.get("reason"),
            "stage": header.get("stage"),
            "arm": header.get("arm"),
            "predicted_runtime_s": header.get("predicted_runtime_s"),
            "predicted_p90_s": header.get("predicted_p90_s"),
            "prediction_source": header.get("prediction_source"),
            "would_queue": header.get("queue"),
            "queue": routing_key if type(routing_key) is str else None,
            "worker": hostname if type(hostname) is str and hostname else _HOST,
            "host": _HOST,
            "worker_accelerator": self.accelerator,
            "args": safe_json(call_args),
            "kwargs": safe_json(call_kwargs),
            "args_bytes": _repr_length(getattr(request, "argsrepr", None)),
            "kwargs_bytes": _repr_length(getattr(request, "kwargsrepr", None)),
            "features": _json_features(call_args, call_kwargs, request),
            "runtime_hint_s": hint,
            "published_at": decided_at if isinstance(decided_at, (int, float)) else start_wall,
            "started_at": start_wall,
            "wait_s": (start_wall - ready_at) if isinstance(ready_at, (int, float)) else None,
            "runtime_s": runtime,
            "cpu_s": _cpu_seconds() - start_cpu,
            "peak_rss_mb": _peak_rss_mb(),
            "outcome": state if type(state) is str else None,
            "retries": retries if type(retries) is int else 0,
        }


def _eta_seconds(eta: Any) -> float | None:
    try:
        from datetime import datetime

        if eta is None or eta == "":
            return None
        moment = eta if isinstance(eta, datetime) else datetime.fromisoformat(str(eta))
        return moment.timestamp()
    except Exception:  # a malformed ETA is no reason to lose the record
        return None


def connect_observer(app: Any) -> Observer:
    """Connect the run observer for ``app`` (once) and flush records at child exit."""
    observer = getattr(app, "_aitp_observer", None)
    if observer is None:
        observer = Observer(app)
        app._aitp_observer = observer
        # Celery before 5.6 tells bound methods apart by their function only: without
        # its own dispatch_uid a second app's observer would silently not be connected.
        uid = f"celery_aitp.observer.{id(observer)}"
        signals.task_prerun.connect(observer.prerun, weak=False, dispatch_uid=uid)
        signals.task_postrun.connect(observer.postrun, weak=False, dispatch_uid=uid)
        signals.worker_process_shutdown.connect(lambda **_: app.aitp.close(), weak=False)
        signals.worker_shutdown.connect(lambda **_: app.aitp.close(), weak=False)
    return observer
