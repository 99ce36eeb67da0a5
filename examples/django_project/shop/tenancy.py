"""The tenant of the request being served, and the tasks published while serving it.

``TenantMiddleware`` finds the tenant of each request (here: the first label of the host
name, ``acme.shop.example`` -> ``acme``; in most projects the signed-in user's
organisation) and keeps it in a context variable for the request's duration.
``TenantTask`` is the project's Celery task class: ``delay`` and ``apply_async`` add that
tenant as the ``aitp_tenant`` header unless the caller gave one, so celery_aitp decides
with it. celery_aitp only accepts tenants of its policy whose ``trusted_header`` is on;
any other name gets the policy's default tenant, counted as ``tenant_unknown`` or
``tenant_refused``, so a made-up host name cannot raise anyone's tier.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from celery import Task
from django.http import HttpRequest, HttpResponse

current_tenant: ContextVar[str | None] = ContextVar("current_tenant", default=None)


def tenant_of(request: HttpRequest) -> str | None:
    """The tenant a request is for: the first label of its host name, if it has several.

    Replace this with your own rule, e.g. ``request.user.organization.slug``.
    """
    labels = request.get_host().split(":", 1)[0].split(".")
    return labels[0].lower() if len(labels) > 2 else None


class TenantMiddleware:
    """Sets ``current_tenant`` while the rest of the stack handles the request."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        token = current_tenant.set(tenant_of(request))
        try:
            return self.get_response(request)
        finally:
            current_tenant.reset(token)  # nothing carries over to the next request


class TenantTask(Task):
    """A task class that publishes with the current request's tenant."""

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        tenant = current_tenant.get()
        if tenant is not None:
            headers = dict(options.get("headers") or {})
            headers.setdefault("aitp_tenant", tenant)  # a caller's own header wins
            options["headers"] = headers
        return super().apply_async(args, kwargs, **options)
