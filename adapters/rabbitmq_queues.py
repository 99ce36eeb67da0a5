"""Queue depth and atomic evacuation on RabbitMQ, over AMQP only.

No management plugin is needed: a passive ``queue.declare`` answers depth (ready
messages) and consumer count without changing the queue. A move runs in an AMQP
transaction on its own channel: a batch of messages is taken with ``basic.get``,
republished to the destination through the default exchange and acknowledged, then
committed. Until the commit the messages are unacknowledged deliveries of the source
queue (no consumer can get them); if the mover dies or the connection drops before the
commit, the broker discards the publishes and requeues the messages. So each message is
in exactly one of the two queues at every instant: nothing lost, nothing duplicated.
The republished message keeps its body and properties (priority, headers, correlation
id, reply-to); its routing key becomes the destination, so a retry of a moved task
follows it instead of going back to the orphaned queue.

Aging (:meth:`RabbitQueueOps.reprioritise`, driven by ``celery_aitp/worker/aging.py``)
takes messages the same way, on a channel in confirm mode: each message chosen for a
higher priority is republished (body and properties kept, only the priority raised;
mandatory, so an unroutable copy raises instead of vanishing), and the original is
acknowledged only after the broker confirmed the copy. Every other message taken is
handed back when the channel closes, and RabbitMQ puts it back in its place. A failure
after a copy was published and before its original was acknowledged (a crash, a lost
connection, a missing confirm) leaves both (one duplicate per failure); nothing is lost.

Oldest-message ages are not available: AMQP cannot look at a message without taking
it (which would mark it redelivered), so :meth:`RabbitQueueOps.oldest_ages` answers
``None`` (unknown) for every queue.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from celery_aitp.errors import AdapterError

#: Messages moved per transaction.
BATCH = 200


class RabbitQueueOps:
    """QueueOps for a Celery app whose broker is RabbitMQ (kombu's ``pyamqp``)."""

    def __init__(self, app: Any, batch: int = BATCH) -> None:
        import amqp

        self.app = app
        self.batch = batch
        self._amqp = amqp
        self._conn: Any = None

    # --- connection ---------------------------------------------------------------

    def _connection(self) -> Any:
        if self._conn is None:
            conn = self.app.connection_for_write()
            try:
                conn.connect()
            except BaseException:
                conn.release()
                raise
            self._conn = conn
        return self._conn

    @contextmanager
    def _channel(self, action: str) -> Iterator[Any]:
        """A fresh channel; any driver error becomes AdapterError and resets the link."""
        channel = None
        try:
            channel = self._connection().channel()
            yield channel
        except AdapterError:
            raise
        except Exception as exc:
            self.close()
            raise AdapterError(f"rabbitmq {action} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            if channel is not None and self._conn is not None:
                try:
                    channel.close()
                except Exception:  # the connection may already be gone; nothing to keep
                    self.close()

    def _declare_ok(self, channel: Any, queue: str) -> tuple[int, int]:
        """(ready messages, consumers) of ``queue``; (0, 0) if it does not exist.

        A missing queue makes the broker close the channel (404); py-amqp reopens it.
        """
        try:
            ok = channel.queue_declare(queue=queue, passive=True)
        except self._amqp.exceptions.NotFound:
            return 0, 0
        return int(ok.message_count), int(ok.consumer_count)

    # --- QueueOps -----------------------------------------------------------------

    def stats(self, queues: Iterable[str]) -> dict[str, tuple[int, int]]:
        """Ready messages and consumer count of each queue (0, 0 when it does not exist)."""
        out: dict[str, tuple[int, int]] = {}
        with self._channel("queue stats") as channel:
            for queue in queues:
                out[queue] = self._declare_ok(channel, queue)
        return out

    def depths(self, queues: Iterable[str]) -> dict[str, int]:
        return {q: depth for q, (depth, _) in self.stats(queues).items()}

    def oldest_ages(self, queues: Iterable[str], now: float) -> dict[str, float | None]:
        return dict.fromkeys(queues)

    def move_all(self, source: str, destination: str) -> int:
        if source == destination:
            raise AdapterError(f"rabbitmq move: source and destination are both {source!r}")
        moved = 0
        with self._channel(f"move {source} -> {destination}") as channel:
            # Declared exactly as Celery declares it, so the publish cannot be unroutable.
            self.app.amqp.queues[destination](channel).declare()
            channel.tx_select()
            while True:
                n = self._move_batch(channel, source, destination)
                moved += n
                if n < self.batch:
                    break
        return moved

    def _move_batch(self, channel: Any, source: str, destination: str) -> int:
        taken = []
        for _ in range(self.batch):
            try:
                message = channel.basic_get(queue=source, no_ack=False)
            except self._amqp.exceptions.NotFound:
                break  # no such queue: nothing to move
            if message is None:
                break
            taken.append(message)
        if not taken:
            return 0
        for message in taken:
            copy = self._amqp.Message(message.body, **message.properties)
            channel.basic_publish(copy, exchange="", routing_key=destination)
        channel.basic_ack(taken[-1].delivery_info["delivery_tag"], multiple=True)
        channel.tx_commit()
        return len(taken)

    def reprioritise(self, queue: str, selector: Any, limit: int) -> tuple[int, int]:
        """Take up to ``limit`` messages of ``queue`` in delivery order; republish those
        ``selector.decide(priority, headers)`` gives a new priority; hand back the rest.

        Stops early once ``selector.done``. Returns (messages taken, messages promoted).
        """
        inspected = 0
        chosen: list[tuple[Any, int]] = []
        with self._channel(f"aging {queue}") as channel:
            depth, _ = self._declare_ok(channel, queue)
            if not depth:
                return 0, 0
            while inspected < limit:
                message = channel.basic_get(queue=queue, no_ack=False)
                if message is None:
                    break
                inspected += 1
                properties = message.properties
                priority = selector.decide(properties.get("priority"),
                                           properties.get("application_headers"))
                if priority is not None:
                    chosen.append((message, priority))
                if selector.done:
                    break
            # Copies are published only now, so this pass cannot take them again.
            if chosen:
                channel.confirm_select()
            for message, priority in chosen:
                self._republish(channel, queue, message, priority)
                channel.basic_ack(message.delivery_info["delivery_tag"])
        # Closing the channel handed back every message taken and not acknowledged.
        return inspected, len(chosen)

    def _republish(self, channel: Any, queue: str, message: Any, priority: int) -> None:
        """Publish a copy with ``priority`` and wait for the broker's confirm.

        The copy takes the original's exchange and routing key when they are the tier
        queue's own (the direct exchange named like the queue, as Celery published it),
        so its delivery info is unchanged; otherwise the default exchange, which can only
        route to this queue.
        """
        info = message.delivery_info
        exchange, routing_key = info.get("exchange"), info.get("routing_key")
        if exchange != queue or routing_key != queue:
            exchange, routing_key = "", queue
        copy = self._amqp.Message(message.body, **dict(message.properties, priority=priority))
        channel.basic_publish_confirm(copy, exchange=exchange, routing_key=routing_key,
                                      mandatory=True, confirm_timeout=30)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.release()
            except Exception:  # closing a broken connection must not raise
                return
