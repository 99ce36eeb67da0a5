"""The dashboard's ASGI application: one route table, HTML and JSON kept apart.

``build_dashboard(middleware, config)`` wires a Fleet reader to the app's store and
broker; ``create_app(dashboard)`` returns the Starlette app wrapped in the security
middleware (outside: Host names, then authentication) and, with ``--proxy-headers``,
uvicorn's forwarded-headers middleware (inside, so authentication sees the connection's
own address). In read-only mode the stage route is not registered at all.
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.responses import RedirectResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from celery_aitp.dashboard.api import Dashboard
from celery_aitp.dashboard.config import DashboardConfig
from celery_aitp.dashboard.fleet import STALE_S, Fleet
from celery_aitp.dashboard.metrics import MetricsApp
from celery_aitp.dashboard.security import AllowedHosts, SecurityMiddleware, TrustedPeers
from celery_aitp.dashboard.views import PAGES, Pages
from celery_aitp.explain import explain_task
from celery_aitp.migration.control import StageControl
from celery_aitp.registry import QUEUE_OPS, resolve


def queue_ops_factory(app: Any) -> Any:
    """Builds the QueueOps adapter for the app's broker (through the port's registry)."""

    def build() -> Any:
        with app.connection_for_write() as conn:
            driver = conn.transport.driver_type
        return resolve(QUEUE_OPS, driver)(app)

    return build


def build_dashboard(middleware: Any, config: DashboardConfig, version: str = "") -> Dashboard:
    """A Dashboard reading the fleet of ``middleware`` (an installed celery_aitp app)."""
    def fleet_policy() -> Any:
        """The policy applied to the fleet (``policy apply``), as workers follow it; the
        app's own before any apply, or while the applied one's tiers differ."""
        middleware.adopt_active_policy()
        return middleware.policy

    settings = middleware.settings
    tasks = tuple(sorted(middleware.app.tasks.keys()))
    fleet = Fleet(middleware.store, fleet_policy(), middleware.default_queue,
                  queue_ops_factory(middleware.app), settings.worker_ttl_s,
                  refresh_s=config.refresh_s, window_s=config.window_s, tasks=tasks,
                  layout=middleware.layout, stale_s=max(STALE_S, 5 * config.refresh_s),
                  follow=fleet_policy)
    control = StageControl(middleware)
    return Dashboard(config=config, fleet=fleet, worker_ttl_s=settings.worker_ttl_s,
                     version=version,
                     drain=lambda: control.drain(control.settle_time()),
                     explainer=lambda task_id: explain_task(middleware, task_id))


def routes(dashboard: Dashboard) -> list[BaseRoute]:
    """Every route, relative to the URL prefix."""
    views = Pages(dashboard.config, dashboard.version)
    table: list[BaseRoute] = []
    for page, (path, _, _) in PAGES.items():
        table.append(Route(path, (lambda p: lambda r: views.render(r, p))(page), name=page))
    table += [
        Route("/tasks/{task_id:str}", lambda r: views.render(r, "task", r.path_params["task_id"]),
              name="task"),
        Route("/api", dashboard.index),
        Route("/api/overview", dashboard.overview),
        Route("/api/tenants", dashboard.tenants),
        Route("/api/queues", dashboard.queues),
        Route("/api/workers", dashboard.workers),
        Route("/api/predictions", dashboard.predictions),
        Route("/api/tasks", dashboard.tasks),
        Route("/api/tasks/{task_id:str}", dashboard.task),
        Route("/api/stage", dashboard.stage, methods=["GET"]),
        Route("/metrics", MetricsApp(dashboard.fleet)),
        Route("/healthz", dashboard.healthz),
        Route("/healthcheck", dashboard.healthcheck),  # Flower's name for the same probe
        Route("/readyz", dashboard.readyz),
        Mount("/static", StaticFiles(packages=[("celery_aitp.dashboard", "static")]),
              name="static"),
    ]
    if not dashboard.config.read_only:
        table.append(Route("/api/stage", dashboard.change_stage, methods=["POST"]))
    return table


def create_app(dashboard: Dashboard) -> Any:
    """The ASGI app: routes under the URL prefix, for the allowed Host names only, behind
    authentication if configured."""
    prefix = dashboard.config.url_prefix
    table = routes(dashboard)
    if prefix:
        table = [Mount(prefix, routes=table),
                 Route("/", lambda r: RedirectResponse(prefix + "/"))]
    config = dashboard.config
    app: Any = Starlette(routes=table)
    if config.proxy_headers:
        app = ProxyHeadersMiddleware(app, trusted_hosts=list(config.forwarded_allow_ips))
    return SecurityMiddleware(app, config.basic_auth, prefix, auth_header=config.auth_header,
                              trusted=TrustedPeers(config.forwarded_allow_ips),
                              hosts=AllowedHosts(config.allowed_hosts, config.address))
