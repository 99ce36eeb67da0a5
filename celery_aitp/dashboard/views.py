"""HTML pages: a small server-rendered shell per page; the data comes from ``/api/...``.

The shell names the page, its API endpoint and the refresh period; ``static/dashboard.js``
polls the endpoint and redraws in place, so pages stay live without reloading. No inline
script (the Content-Security-Policy forbids it); values reach the page as data attributes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from html import escape
from importlib import resources

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from celery_aitp.dashboard.config import DashboardConfig
from celery_aitp.dashboard.security import CSRF_COOKIE, new_csrf_token

#: page id -> (path, title, API endpoint); the order is the navigation's.
PAGES = {
    "overview": ("/", "Overview", "overview"),
    "tenants": ("/tenants", "Tenants", "tenants"),
    "queues": ("/queues", "Queues", "queues"),
    "workers": ("/workers", "Workers", "workers"),
    "predictions": ("/predictions", "Predictions", "predictions"),
    "tasks": ("/tasks", "Tasks", "tasks"),
    "stage": ("/stage", "Stage", "stage"),
}


#: A ``{{name}}`` placeholder of the layout.
PLACEHOLDER = re.compile(r"\{\{([a-z_]+)\}\}")


def _template(name: str) -> str:
    return (resources.files("celery_aitp.dashboard") / "templates" / name).read_text("utf-8")


def fill(template: str, values: Mapping[str, str]) -> str:
    """``template`` with each ``{{name}}`` of ``values`` replaced, in one pass: what a
    value holds (a task id from the URL: ``/tasks/{{body}}``) is never read as a
    placeholder. Unknown names stay as they are."""
    return PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)


class Pages:
    """Renders the shell of every page."""

    def __init__(self, config: DashboardConfig, version: str) -> None:
        self.config = config
        self.version = version
        self.layout = _template("layout.html")
        self.bodies = {page: _template(f"{page}.html") for page in (*PAGES, "task")}
        self.control = _template("stage_control.html")

    def _nav(self, active: str) -> str:
        prefix = self.config.url_prefix
        links = []
        for page, (path, title, _) in PAGES.items():
            current = ' aria-current="page"' if page == active else ""
            links.append(f'<a href="{escape(prefix + path)}"{current}>{escape(title)}</a>')
        return "\n      ".join(links)

    def render(self, request: Request, page: str, task_id: str = "") -> Response:
        nav_page = "tasks" if page == "task" else page
        title = f"Task {task_id}" if page == "task" else PAGES[page][1]
        api = f"tasks/{task_id}" if page == "task" else PAGES[page][2]
        token = request.cookies.get(CSRF_COOKIE) or new_csrf_token()
        body = self.bodies[page]
        if self.config.read_only:
            body = body.replace("<!--control-->", '<p class="note">Read-only mode: stage '
                                "control is disabled.</p>")
        else:
            body = body.replace("<!--control-->", self.control)
        values = {
            "title": escape(title), "page": escape(page), "prefix": escape(self.config.url_prefix),
            "api": escape(api), "refresh_ms": str(int(self.config.refresh_s * 1000)),
            "read_only": "1" if self.config.read_only else "0", "csrf": escape(token),
            "task_id": escape(task_id), "nav": self._nav(nav_page), "body": body,
            "version": escape(self.version),
        }
        response = HTMLResponse(fill(self.layout, values))
        # Secure under TLS (seen through --proxy-headers behind a TLS proxy)
        response.set_cookie(CSRF_COOKIE, token, httponly=False, samesite="strict",
                            secure=request.url.scheme == "https",
                            path=self.config.url_prefix or "/")
        return response
