"""The package root is lazy: ``import celery_aitp`` loads no publish stack, no Celery."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

import celery_aitp


def modules_after(statement: str) -> list[str]:
    """Modules loaded by ``statement`` in a fresh interpreter."""
    code = f"import sys; {statement}; import json; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


def test_importing_the_package_loads_none_of_its_modules_nor_celery() -> None:
    loaded = modules_after("import celery_aitp")
    ours = [m for m in loaded if m.startswith("celery_aitp.")]
    assert ours == [], ours
    assert not {"celery", "kombu", "pydantic", "redis"} & set(loaded)


def test_a_public_name_loads_only_what_it_needs() -> None:
    loaded = modules_after("from celery_aitp import PolicyError")
    assert "celery_aitp.errors" in loaded
    heavy = ("celery_aitp.publish", "celery_aitp.middleware")
    assert not [m for m in loaded if m.startswith(heavy)]


@pytest.mark.parametrize("name", sorted(set(celery_aitp.__all__) - {"install"}))
def test_every_public_name_is_the_object_its_module_defines(name: str) -> None:
    module = importlib.import_module(celery_aitp._EXPORTS[name])
    assert getattr(celery_aitp, name) is getattr(module, name)
    assert name in dir(celery_aitp)


def test_all_lists_exactly_the_lazy_names_and_install() -> None:
    assert set(celery_aitp.__all__) == set(celery_aitp._EXPORTS) | {"install"}
    assert callable(celery_aitp.install)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        celery_aitp.Nope  # noqa: B018
    assert not hasattr(celery_aitp, "_private")
