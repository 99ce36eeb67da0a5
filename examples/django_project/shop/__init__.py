"""The example Django project; its Celery app is loaded with Django (Celery's own pattern)."""

from shop.celery import app as celery_app

__all__ = ["celery_app"]
