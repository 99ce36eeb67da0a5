"""Opening JSON-lines files the same way everywhere: plain or gzip-compressed.

Traces, observation exports and training files are often kept as ``.jsonl.gz``; every
reader (``replay``, ``train``, ``predict``) opens them through :func:`open_text`, so a
file one of them reads, the others read too.
"""

from __future__ import annotations

import gzip
import io
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, NamedTuple

#: What reading a cut or damaged ``.gz`` raises part way (what was read before stands).
TRUNCATED = (EOFError, zlib.error)


def open_text(path: str | Path, mode: str = "r") -> IO[str]:
    """A text handle; ``.gz`` files are (de)compressed on the fly. Bytes that are not
    UTF-8 are read as U+FFFD (the line then fails as JSON, or keeps the odd name)."""
    path = Path(path)
    errors = "replace" if mode == "r" else "strict"
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.GzipFile(path, mode + "b"), encoding="utf-8",
                                errors=errors)
    return path.open(mode, encoding="utf-8", errors=errors)


class Skipped(NamedTuple):
    """What :func:`json_lines` gives for a line that holds no JSON value (``not JSON``),
    or for the cut end of a damaged ``.gz`` (``truncated file``)."""

    reason: str


def json_lines(path: str | Path) -> Iterator[Any]:
    """Each non-blank line's JSON value in order, or :class:`Skipped` with the reason;
    never raises for what the file holds."""
    with open_text(path) as handle:
        try:
            for line in handle:
                text = line.strip()
                if not text:
                    continue
                try:
                    yield json.loads(text)
                except (ValueError, RecursionError):  # RecursionError: nested too deep
                    yield Skipped("not JSON")
        except TRUNCATED:  # a cut or damaged .gz: what was read stands
            yield Skipped("truncated file")
