"""Resolve adapter implementations by alias, dotted path or object (one table)."""

from __future__ import annotations

import difflib
from typing import Any

from celery_aitp.errors import AdapterError

#: Broker transport driver -> queue operations.
QUEUE_OPS = {
    "redis": "celery_aitp_adapters.redis_queues:RedisQueueOps",
    "amqp": "celery_aitp_adapters.rabbitmq_queues:RabbitQueueOps",
    "memory": "celery_aitp.stubs:MemoryQueueOps",
}

#: Accelerator probes.
ACCELERATOR_PROBES = {
    "auto": "celery_aitp_adapters.accelerators:auto_probe",
    "none": "celery_aitp.stubs:NoAccelerators",
    "nvml": "celery_aitp_adapters.accelerators:NvmlProbe",
    "nvidia-smi": "celery_aitp_adapters.accelerators:NvidiaSmiProbe",
}


def resolve(table: dict[str, str], name: Any) -> Any:
    """An object for ``name``: an alias from ``table``, a 'module:attr' path, or the object."""
    if not isinstance(name, str):
        return name
    target = table.get(name, name)
    if ":" not in target:
        close = difflib.get_close_matches(name, table, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise AdapterError(f"unknown adapter {name!r} (known: {', '.join(table)}).{hint}")
    module, _, attr = target.partition(":")
    try:
        imported = __import__(module, fromlist=[attr])
        return getattr(imported, attr)
    except (ImportError, AttributeError) as exc:
        raise AdapterError(
            f"adapter {name!r} ({target}) is not available: {exc}. "
            "Is its extra installed (e.g. pip install 'celery-aitp[rabbitmq]')?"
        ) from exc
