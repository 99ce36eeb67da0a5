"""Settings of the example project: only what the Celery and celery_aitp wiring needs."""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-a-secret")
DEBUG = os.environ.get("DJANGO_DEBUG") == "1"
ALLOWED_HOSTS = [".shop.example", "localhost", "127.0.0.1", "testserver"]
INSTALLED_APPS = ["reports"]
MIDDLEWARE = ["shop.tenancy.TenantMiddleware"]
ROOT_URLCONF = "shop.urls"
DATABASES: dict = {}  # the example keeps no data of its own
USE_TZ = True

# Celery: every CELERY_* setting is read by shop/celery.py.
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0")
CELERY_TASK_DEFAULT_QUEUE = "celery"

# celery_aitp: CELERY_AITP_<NAME> is the aitp_<name> setting of the configuration reference.
# The policy file shared by every producer and worker (validate it with
# `celery-aitp validate`).
CELERY_AITP_POLICY = os.environ.get("CELERY_AITP_POLICY",
                                    str(BASE_DIR.parent / "aitp.yaml"))
# The store: the broker's Redis unless set (required when the broker is RabbitMQ).
CELERY_AITP_STORE_URL = os.environ.get("CELERY_AITP_STORE_URL") or None
# Separates this deployment's keys from others sharing the Redis.
CELERY_AITP_KEY_PREFIX = os.environ.get("CELERY_AITP_KEY_PREFIX", "shop")
