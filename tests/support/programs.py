"""System programs some tests drive (promtool, nginx, openssl), from Debian's packages.

In CI a missing program fails the test loudly (.ci/run installs the packages); elsewhere
the test is skipped with the package to install.
"""

from __future__ import annotations

import shutil

import pytest

from tests.support.services import IN_CI


def program(name: str, package: str) -> str:
    """The path of ``name``; fails in CI, skips elsewhere, when it is not installed."""
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin")
    if path:
        return path
    message = f"{name} is not installed (apt-get install {package})"
    if IN_CI:
        pytest.fail(f"{message}: CI must provide it (.ci/run installs it)", pytrace=False)
    pytest.skip(message)
