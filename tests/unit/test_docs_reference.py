"""The docs' configuration reference names every setting and policy field."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from celery_aitp.policy import Policy
from celery_aitp.settings import Settings

REFERENCE = (
    Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
).read_text(encoding="utf-8")


def field_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Dotted names of a model's fields, descending into nested models."""
    paths = []
    for name, field in model.model_fields.items():
        paths.append(prefix + name)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            paths += field_paths(annotation, f"{prefix}{name}.")
    return paths


def test_every_setting_is_documented() -> None:
    missing = [name for name in Settings.model_fields if f"`{name}`" not in REFERENCE]
    assert not missing, f"settings missing from docs/configuration.md: {missing}"


def test_every_policy_field_is_documented() -> None:
    missing = [path for path in field_paths(Policy) if f"`{path}`" not in REFERENCE]
    assert not missing, f"policy fields missing from docs/configuration.md: {missing}"
