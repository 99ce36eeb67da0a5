"""JSON endpoints: one per page, plus stage control, health and readiness.

Every handler is synchronous (Starlette runs it in its thread pool) and reads the shared
Snapshot, so a busy page never multiplies the load on the store or the broker.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from celery_aitp.core.view import stage_from_doc
from celery_aitp.dashboard import pages
from celery_aitp.dashboard.config import DashboardConfig
from celery_aitp.dashboard.explain import task_page
from celery_aitp.dashboard.fleet import Fleet
from celery_aitp.dashboard.flower import flower_link
from celery_aitp.dashboard.security import cross_site_problem
from celery_aitp.dashboard.stage_control import change_stage
from celery_aitp.errors import AitpError, PolicyError, StoreError
from celery_aitp.explain import explain
from celery_aitp.redact import redact

#: path -> what it returns (served at /api and in docs/dashboard.md's API reference).
ENDPOINTS = {
    "GET /api/overview": "stage and split, decisions per second, routed/fallback shares by "
                         "reason (window and total), SLA hit rate per tier, workers, model",
    "GET /api/tenants": "per tenant: weight, work share vs fair share, queue wait p50/p95 per "
                        "tier; Jain's fairness index, priority entropy",
    "GET /api/queues": "every tier queue and the default queue: depth, oldest-message age, "
                       "consumers, orphaned flag, spilling (backlog per slot)",
    "GET /api/workers": "AITP workers: accelerator class, tenants, tiers, queues, heartbeat "
                        "(and Flower's page of each, with --flower-url)",
    "GET /api/predictions": "predicted vs actual run time points, error by task, model",
    "GET /api/tasks?limit=&task=&tenant=": "recent decisions, newest first",
    "GET /api/tasks/{task_id}": "explain breakdown of one task (404 if unknown; Flower's "
                                "page of it, with --flower-url)",
    "GET /api/stage": "live stage document and its change history",
    "POST /api/stage": "replace the stage document (not in read-only mode; JSON, same-origin, "
                       "X-AITP-CSRF token)",
    "GET /metrics": "Prometheus text format or OpenMetrics (by Accept), gzip if asked, "
                    "aitp_ prefix",
    "GET /healthz": "process up",
    "GET /healthcheck": "process up, 'OK' as Flower answers",
    "GET /readyz": "store reachable, policy valid, model loaded or cold start (503 if not)",
}


#: How deep the JSON of a request body may nest (the stage document needs three levels).
MAX_JSON_DEPTH = 32
_TOO_DEEP = f"(body): JSON nested deeper than {MAX_JSON_DEPTH} levels"


def json_depth(value: Any) -> int:
    """How deep ``value`` (parsed JSON) nests: 0 for a scalar; without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else \
            item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, depth)
            if depth <= MAX_JSON_DEPTH:  # one level past the limit is enough to refuse
                stack.extend((child, depth + 1) for child in children)
    return deepest


def parse_json_body(raw: bytes) -> Any:
    """A request body's JSON value; ValueError saying why if it is not JSON or nests
    deeper than ``MAX_JSON_DEPTH`` (the parser itself recurses: 100,000 nested lists
    would exhaust the interpreter's stack)."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise ValueError(_TOO_DEEP) from None
    except ValueError:
        raise ValueError("(body): not valid JSON") from None
    if json_depth(value) > MAX_JSON_DEPTH:
        raise ValueError(_TOO_DEEP)
    return value


def _clean(value: Any) -> Any:
    """JSON-safe: non-finite floats become null (browsers reject NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_clean(v) for v in value]
    return value


class ApiResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return json.dumps(_clean(content), default=str, separators=(",", ":")).encode("utf-8")


@dataclass
class Dashboard:
    """What the handlers share: options, the fleet reader and the app's settings."""

    config: DashboardConfig
    fleet: Fleet
    worker_ttl_s: float
    started_at: float = field(default_factory=time.time)
    version: str = ""
    #: Drains tier queues after a switch to coexistence (migration rollback); None: the
    #: janitor does it on its next pass.
    drain: Callable[[], dict[str, int]] | None = None
    #: Explains a task id from the decision log (``celery_aitp.explain.explain_task``);
    #: None: from the records in the dashboard's window, under the active policy.
    explainer: Callable[[str], dict[str, Any] | None] | None = None

    @property
    def policy(self) -> Any:
        return self.fleet.policy

    # --- page data ------------------------------------------------------------------

    def overview(self, request: Request) -> Response:
        return ApiResponse(pages.overview(self.fleet.snapshot(), self.policy, self.worker_ttl_s))

    def tenants(self, request: Request) -> Response:
        return ApiResponse(pages.tenants(self.fleet.snapshot(), self.policy, self.fleet.window_s))

    def queues(self, request: Request) -> Response:
        return ApiResponse(pages.queues(self.fleet.snapshot(), self.fleet.default_queue))

    def workers(self, request: Request) -> Response:
        body = pages.workers(self.fleet.snapshot(), self.worker_ttl_s)
        for row in body["workers"]:
            row["flower_url"] = flower_link(self.config.flower_url, "worker", row["worker"])
        return ApiResponse(body)

    def predictions(self, request: Request) -> Response:
        return ApiResponse(pages.predictions(self.fleet.snapshot()))

    def tasks(self, request: Request) -> Response:
        q = request.query_params
        try:
            limit = max(1, min(1000, int(q.get("limit", "100"))))
        except ValueError:
            return ApiResponse({"error": "limit: expected an integer"}, status_code=400)
        return ApiResponse(pages.recent_tasks(self.fleet.snapshot(), limit, q.get("task"),
                                              q.get("tenant")))

    def task(self, request: Request) -> Response:
        task_id = request.path_params["task_id"]
        try:
            explained = self._explain(task_id)
            observation = self.fleet.obs.find("task_id", task_id)
        except StoreError as exc:
            return ApiResponse({"error": redact(exc)}, status_code=503)
        body = task_page(task_id, explained, observation, self.policy)
        body["flower_url"] = flower_link(self.config.flower_url, "task", task_id)
        return ApiResponse(body, status_code=200 if body["found"] else 404)

    def _explain(self, task_id: str) -> dict[str, Any] | None:
        if self.explainer is not None:
            return self.explainer(task_id)
        record = self.fleet.decisions.find("task_id", task_id)
        return None if record is None else explain(
            record, self.policy, "from the dashboard's window, under the active policy")

    # --- stage ----------------------------------------------------------------------

    def stage(self, request: Request) -> Response:
        store = self.fleet.store
        try:
            doc = store.read_stage()
            history = store.stage_history(50)
        except StoreError as exc:
            return ApiResponse({"error": redact(exc)}, status_code=503)
        stage, split = stage_from_doc(doc, self.policy)
        return ApiResponse({"stage": stage.value, "split": split.model_dump(mode="json"),
                            "stored": doc is not None, "history": history,
                            "read_only": self.config.read_only,
                            "tenants": list(self.policy.tenants),
                            "tiers": list(self.policy.tier_names)})

    async def change_stage(self, request: Request) -> Response:
        problem = cross_site_problem({k.lower(): v for k, v in request.headers.items()},
                                     request.url.scheme, dict(request.cookies))
        if problem:
            return ApiResponse({"error": problem}, status_code=403)
        try:
            body = parse_json_body(await request.body())
        except ValueError as exc:
            return ApiResponse({"error": str(exc)}, status_code=400)
        user = request.scope.get("state", {}).get("user") or "anonymous"
        client = request.client.host if request.client else "?"
        try:
            await run_in_threadpool(self.fleet.follow_policy)  # a tenant applied just now
            result = change_stage(self.fleet.store, self.policy, body,
                                  who=f"dashboard:{user}@{client}")
        except PolicyError as exc:
            return ApiResponse({"error": redact(exc)}, status_code=400)
        except StoreError as exc:
            return ApiResponse({"error": redact(exc)}, status_code=503)
        if result["stage"]["stage"] == "coexistence" and self.drain is not None:
            try:  # a rollback by hand: nothing may keep waiting in a tier queue
                result["moved"] = await run_in_threadpool(self.drain)
            except AitpError as exc:
                result["moved_error"] = redact(f"{exc} (the janitor drains them on its next pass)")
        self.fleet.snapshot(max_age_s=0)  # the next page refresh shows the change
        return ApiResponse(result)

    # --- health ---------------------------------------------------------------------

    def healthz(self, request: Request) -> Response:
        return ApiResponse({"status": "ok", "version": self.version,
                            "uptime_s": time.time() - self.started_at})

    def healthcheck(self, request: Request) -> Response:
        return PlainTextResponse("OK")

    def readyz(self, request: Request) -> Response:
        snap = self.fleet.snapshot()
        store_ok = self.fleet.store.ping()
        model = snap.model or {}
        if model.get("loaded"):
            model_check = {"ok": True, "state": "loaded", "version": model.get("version")}
        elif model.get("fields") or model.get("error"):
            model_check = {"ok": False, "state": "invalid",
                           "detail": model.get("error") or "model hash has no version"}
        else:
            model_check = {"ok": True, "state": "cold_start"}
        checks: dict[str, dict[str, Any]] = {
            "store": {"ok": store_ok, "detail": None if store_ok else snap.store_error},
            "policy": {"ok": True, "tenants": len(self.policy.tenants),
                       "tiers": list(self.policy.tier_names)},
            "model": model_check,
            "broker": {"ok": snap.broker_ok, "detail": snap.broker_error, "required": False},
        }
        ready = all(c["ok"] for name, c in checks.items() if name != "broker")
        return ApiResponse({"status": "ready" if ready else "not_ready", "checks": checks},
                           status_code=200 if ready else 503)

    def index(self, request: Request) -> Response:
        return ApiResponse({"endpoints": ENDPOINTS, "read_only": self.config.read_only})
