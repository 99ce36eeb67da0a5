"""The shared store: the one place producers and workers agree on live state."""

from celery_aitp.store.keys import Keys
from celery_aitp.store.redis_store import RedisStore, connect, redis_url_for

__all__ = ["Keys", "RedisStore", "connect", "redis_url_for"]
