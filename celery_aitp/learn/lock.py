"""The trainer lock: one trainer trains and promotes at a time.

``celery aitp trainer`` rounds, its beat task and ``celery aitp train`` all take
``<prefix>:lock:trainer``. It is taken with a short expiry (:data:`TTL_S`) and renewed
every third of it by a background thread while its holder works, so a round may last as
long as training takes, and a trainer that dies frees it within :data:`TTL_S`. Only its
holder releases or renews it (the value is the holder's name, checked in Redis): a round
that lost the lock (the store was unreachable for longer than the expiry) never deletes
the next trainer's.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid

import redis

from celery_aitp.errors import StoreError
from celery_aitp.store import RedisStore

#: Expiry of the trainer lock, seconds; renewed every third of it while held.
TTL_S = 60.0


def lock_key(store: RedisStore) -> str:
    return store.keys.any("lock", "trainer")


class TrainerLock:
    """Take with :meth:`acquire`; give back with :meth:`release` (in ``finally``)."""

    def __init__(self, store: RedisStore, ttl_s: float = TTL_S) -> None:
        self.store = store
        self.key = lock_key(store)
        self.ttl_s = ttl_s
        self.owner = (f"{socket.gethostname()} pid {os.getpid()} since "
                      f"{time.strftime('%H:%M:%S')} #{uuid.uuid4().hex[:8]}")
        #: Set when a renewal found the lock expired or held by another trainer.
        self.lost = False
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def holder(self) -> str | None:
        """Who holds the lock now (its owner name), or None."""
        try:
            raw = self.store.client.get(self.key)
        except (redis.RedisError, OSError):  # only for a message: not worth failing over
            return None
        if raw is None:
            return None
        return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)

    def acquire(self) -> bool:
        """Take the lock and start renewing it; False if another trainer holds it."""
        if not self.store.try_lock(self.key, self.ttl_s, self.owner):
            return False
        self.lost = False
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew, name="aitp-trainer-lock",
                                         daemon=True)
        self._renewer.start()
        return True

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                if not self.store.extend_lock(self.key, self.ttl_s, self.owner):
                    self.lost = True
                    return
            except StoreError:
                continue  # again at the next tick; the lock expires if the store stays away

    def release(self) -> None:
        """Stop renewing and delete the lock if this trainer still holds it."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
            self._renewer = None
        try:
            if not self.store.release_lock(self.key, self.owner):
                self.lost = True
        except StoreError:
            pass  # it expires on its own within ttl_s
