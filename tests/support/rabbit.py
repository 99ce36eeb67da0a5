"""RabbitMQ housekeeping for tests: delete what a test declared in the test vhost."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import amqp
from kombu import Connection, pools


def delete_queues(url: str, names: Iterable[str]) -> None:
    """Delete these queues and the direct exchanges of the same name, if they exist.

    Also closes kombu's process-wide connection pools: their connections remember what
    they declared and would not declare a deleted queue again for the next test.
    """
    with Connection(url, connect_timeout=5) as conn:
        channel = conn.channel()
        for name in dict.fromkeys(names):
            for delete in (channel.queue_delete, channel.exchange_delete):
                with contextlib.suppress(amqp.exceptions.NotFound):  # py-amqp reopens
                    delete(name)
        channel.close()
    pools.reset()
