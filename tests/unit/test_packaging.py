"""Every Python package of the source tree ships: setup.cfg lists packages by name, so a
new sub-package left out would install without it (and import fine only from a checkout)."""

from __future__ import annotations

import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def listed_packages() -> set[str]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return {line.strip() for line in config["options"]["packages"].splitlines() if line.strip()}


def source_packages() -> set[str]:
    found = set()
    for path in (ROOT / "celery_aitp").rglob("*.py"):
        if "__pycache__" not in path.parts:
            found.add(".".join(path.parent.relative_to(ROOT).parts))
    return found


def test_setup_cfg_lists_every_package_of_the_source_tree():
    assert source_packages() - listed_packages() == set()


def test_setup_cfg_lists_no_package_that_is_gone():
    gone = {p for p in listed_packages() - source_packages() if p.startswith("celery_aitp.")}
    assert gone == set()
