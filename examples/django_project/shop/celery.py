"""The project's Celery app, configured from Django settings, with celery_aitp installed.

Workers (from this directory):

    celery -A shop worker --aitp-tenant '*' --aitp-accelerator cpu -n cpu@%h
    celery -A shop worker -n plain@%h          # Celery's default queue, as before
"""

import os

from celery import Celery

import celery_aitp
from shop.tenancy import TenantTask

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")

# TenantTask adds the tenant of the current request to every task published while
# serving it (shop/tenancy.py).
app = Celery("shop", task_cls=TenantTask)
# Every CELERY_* setting, CELERY_AITP_* included: CELERY_AITP_POLICY becomes
# app.conf.aitp_policy, which celery_aitp reads (AITP_* environment variables still win).
app.config_from_object("django.conf:settings", namespace="CELERY")
celery_aitp.install(app)
app.autodiscover_tasks()
