"""Headless Chromium for browser tests: Debian's chromium driven by Python playwright.

Playwright cannot download its own browser here, so the system's chromium is used
(``CHROMIUM_PATH``, else ``chromium`` or ``chromium-browser`` on PATH). In CI a missing
browser or playwright fails the test loudly (.ci/run installs chromium); elsewhere the
test is skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.support.services import IN_CI

LAUNCH_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def _unavailable(message: str) -> None:
    if IN_CI:
        pytest.fail(f"{message}: CI must provide it (.ci/run installs chromium)", pytrace=False)
    pytest.skip(message)


def chromium_path() -> str:
    path = (os.environ.get("CHROMIUM_PATH") or shutil.which("chromium")
            or shutil.which("chromium-browser"))
    if not path:
        _unavailable("chromium is not installed (apt-get install chromium)")
    return str(path)


@contextmanager
def browser_context(**options: Any) -> Iterator[Any]:
    """A fresh persistent context (own user-data-dir) of headless chromium."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the playwright package is not installed (pip install playwright)")
    executable = chromium_path()
    profile = tempfile.mkdtemp(prefix="aitp-chromium-")
    try:
        with sync_playwright() as p:
            context = p.chromium.launch_persistent_context(
                profile, executable_path=executable, headless=True, args=LAUNCH_ARGS, **options)
            try:
                yield context
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
