"""Exception hierarchy.

    AitpError
     +-- PolicyError      invalid policy or settings (raised at start-up, never on publish)
     +-- StoreError       the shared store cannot be reached or holds bad data
     +-- StageConflict    the stage changed under a compare-and-set write (the guard)
     +-- AdapterError     a broker or platform adapter failed (translated at the edge)
     +-- ModelError       a model file is corrupt or incompatible
     +-- MissingExtra     an optional dependency is not installed (names the extra)

The publish path never lets any of these escape: it falls back and counts instead.
"""

from __future__ import annotations

from typing import Any

from celery_aitp.redact import redact


class AitpError(Exception):
    """Root of every error this package raises on purpose.

    Its text is redacted (URL passwords become ``***``) when it is made, so no handler
    that prints or returns one can show a credential from a client library's message.
    """

    def __init__(self, *args: Any) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class PolicyError(AitpError):
    """The policy or a setting is invalid; the message names every bad field by path."""


class StoreError(AitpError):
    """The shared store is unreachable or returned something malformed."""


class StageConflict(AitpError):
    """Someone else changed the stage since it was read; nothing was written."""


class AdapterError(AitpError):
    """A broker- or platform-specific adapter failed."""


class ModelError(AitpError):
    """A runtime model could not be loaded (corrupt, wrong format, wrong features)."""


class MissingExtra(AitpError):
    """A command needs an optional dependency that is not installed; names the extra."""
