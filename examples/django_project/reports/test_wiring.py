"""The Django wiring: CELERY_AITP_* settings reach celery_aitp, and a task published while
serving a request carries that request's tenant into the decision."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from celery.signals import after_task_publish

from celery_aitp.core.request import read_header

POLICY_FILE = "aitp.yaml"


@pytest.fixture
def published(django_project: Any) -> Iterator[list[dict[str, Any]]]:
    """Headers of every message published during the test."""
    seen: list[dict[str, Any]] = []

    def capture(headers: Any = None, **_: Any) -> None:
        seen.append(dict(headers))

    after_task_publish.connect(capture, weak=False)
    yield seen
    after_task_publish.disconnect(capture)


def ask(host: str) -> Any:
    from django.test import Client

    return Client(HTTP_HOST=host).get("/reports/10")


def test_celery_aitp_settings_come_from_django_settings(django_project):
    from django.conf import settings

    with open(settings.CELERY_AITP_POLICY) as handle:
        policy_file = yaml.safe_load(handle)
    aitp = django_project.aitp
    assert settings.CELERY_AITP_POLICY.endswith(POLICY_FILE)
    assert set(aitp.policy.tenants) == set(policy_file["tenants"])
    assert aitp.settings.key_prefix == settings.CELERY_AITP_KEY_PREFIX
    assert aitp.settings.store_url == settings.CELERY_AITP_STORE_URL


@pytest.mark.parametrize("host, header, tenant", [
    ("acme.shop.example", "acme", "acme"),
    ("globex.shop.example:8000", "globex", "globex"),
    ("localhost", None, "default"),  # no tenant in the request: the policy's default
    ("mallory.shop.example", "mallory", "default"),  # not a tenant of the policy
    ("ops.shop.example", "ops", "default"),  # trusted_header: false, cannot be claimed
])
def test_a_task_published_for_a_request_is_decided_for_its_tenant(
        published, host, header, tenant):
    response = ask(host)
    assert response.status_code == 202
    (headers,) = published
    assert headers["id"] == response.json()["task_id"]
    assert headers.get("aitp_tenant") == header
    decision = read_header(headers["aitp"])
    assert decision["tenant"] == tenant
    assert decision["stage"] == "coexistence" and decision["routed"] is False


def test_the_tenant_does_not_outlive_its_request(published):
    from shop.tenancy import current_tenant

    from reports.tasks import build_report

    ask("acme.shop.example")
    assert current_tenant.get() is None
    build_report.delay(1)  # e.g. from a management command: no request, no tenant
    assert "aitp_tenant" not in published[-1]


def test_a_callers_own_tenant_header_wins(published):
    from shop.tenancy import current_tenant

    from reports.tasks import build_report

    token = current_tenant.set("acme")
    try:
        build_report.apply_async((1,), headers={"aitp_tenant": "globex"})
    finally:
        current_tenant.reset(token)
    assert published[-1]["aitp_tenant"] == "globex"
    assert read_header(published[-1]["aitp"])["tenant"] == "globex"
