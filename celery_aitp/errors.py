"""Exception hierarchy.

    AitpError
     +-- PolicyError      invalid policy or settings (raised at start-up, never on publish)
     +-- StoreError       the shared store cannot be reached or holds bad data
     +-- StageConflict    the stage changed under a compare-and-set write (the guard)
     +-- AdapterError     a broker or platform adapter failed (translated at the edge)
     +-- ModelError       a model file is corrupt or incompatible

The publish path never lets any of these escape: it falls back and counts instead.
"""

from __future__ import annotations


class AitpError(Exception):
    """Root of every error this package raises on purpose."""


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
