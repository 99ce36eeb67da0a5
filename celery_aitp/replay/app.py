"""What a replay takes from a Celery app: its pipeline, policy, declarations and queue."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from celery_aitp.errors import ModelError, StoreError
from celery_aitp.policy import Policy, read_policy_file
from celery_aitp.predict.bundle import ModelBundle
from celery_aitp.predict.model_store import ModelStore
from celery_aitp.publish.pipeline import Pipeline, default_stages
from celery_aitp.publish.tenant_stage import TenantStage
from celery_aitp.replay.feed import StoreFactory
from celery_aitp.replay.routers import Declarations, recorded_declarations
from celery_aitp.replay.runner import PipelineFactory, PolicyUnderTest
from celery_aitp.store import Keys, RedisStore, connect

logger = logging.getLogger(__name__)


def default_pipeline(policy: Policy, clock: Callable[[], float],
                     profile_refresh_s: float = 10.0) -> Pipeline:
    """A fresh pipeline of the product's default stages for ``policy``, on ``clock``."""
    return Pipeline(default_stages(policy, profile_refresh_s, clock))


def as_recorded(records: Iterable[Mapping[str, Any]], policy: Policy
                ) -> list[dict[str, Any]]:
    """The records as ``policy``'s workers would have recorded them: with the tenant the
    policy resolves from each record's (claimed) tenant, as the replay's simulated workers
    record their runs. A model trained on them sees the same tenants and per-tenant
    history when it predicts in the replay as it saw in training."""
    resolve = TenantStage(policy).resolve
    return [dict(record, tenant=resolve(record.get("tenant"), None)[0]) for record in records]


def pipeline_factory(policy: Policy) -> PipelineFactory:
    return lambda clock: default_pipeline(policy, clock)


def app_pipeline_factory(mw: Any) -> PipelineFactory:
    """The app's pipeline: fresh default stages, plus every stage the app swapped in
    (``use_stage``), used as they are."""

    def build(clock: Callable[[], float]) -> Pipeline:
        pipeline = default_pipeline(mw.policy, clock, mw.settings.profile_refresh_s)
        defaults = {s.name: s for s in pipeline.stages}
        for stage in mw.pipeline.stages:
            default = defaults.get(stage.name)
            if default is None or type(default) is not type(stage):
                pipeline = pipeline.replace(stage.name, stage)
        return pipeline

    return build


def _names(paths: Sequence[str]) -> list[str]:
    names: list[str] = []
    for path in paths:
        name = Path(path).stem or "policy"
        while name in names or name in ("fifo", "oracle"):
            name += "'"
        names.append(name)
    return names


def policies_from_files(paths: Sequence[str]) -> list[PolicyUnderTest]:
    """Each policy file with the default pipeline built for it; raises PolicyError."""
    return [PolicyUnderTest(name, policy, pipeline_factory(policy))
            for name, policy in zip(_names(paths), map(read_policy_file, paths), strict=True)]


def policies_for_app(mw: Any, paths: Sequence[str]) -> list[PolicyUnderTest]:
    """The app's own pipeline (every stage it installed) first, unless files are given."""
    if paths:
        return policies_from_files(paths)
    return [PolicyUnderTest("aitp", mw.policy, app_pipeline_factory(mw))]


def app_declarations(mw: Any) -> Declarations:
    """The app's ``@app.task(aitp={...})`` declarations; the record's for unknown tasks."""
    tasks: Mapping[str, Any] = mw.app.tasks

    def declared(task: str, record: Mapping[str, Any]) -> Mapping[str, Any]:
        if task in tasks:
            return mw.declared(task)
        return recorded_declarations(task, record)

    return declared


def app_model(mw: Any) -> ModelBundle | None:
    """The app's current runtime model (None if there is none or the store is unreachable)."""
    try:
        return ModelStore(mw.store).read()
    except (StoreError, ModelError) as exc:
        logger.warning("aitp replay: not using the app's model: %s", exc)
        return None


@contextlib.contextmanager
def embedded_stores(prefix: str = "aitp-replay",
                    model: ModelBundle | None = None) -> Iterator[StoreFactory]:
    """Private stores for the pipeline's sources, on one embedded Redis started on demand;
    each starts with ``model`` promoted (the runtime model the replay predicts with)."""
    from celery_aitp.demo.embedded import EmbeddedRedis

    server: EmbeddedRedis | None = None
    made = 0

    def factory() -> RedisStore:
        nonlocal server, made
        if server is None:
            server = EmbeddedRedis().start()
        made += 1
        store = RedisStore(connect(server.url, 5.0), Keys(f"{prefix}-{made}"))
        if model is not None:
            ModelStore(store).promote(model)
        return store

    try:
        yield factory
    finally:
        if server is not None:
            server.stop()
