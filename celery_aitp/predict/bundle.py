"""A runtime model as stored: two LightGBM text models plus JSON metadata. Never pickle.

On disk a model is a directory (``celery-aitp train --out MODEL``)::

    MODEL/meta.json   format, version, feature names, vocabularies, metrics, window
    MODEL/p50.txt     LightGBM text model of log runtime (L2)
    MODEL/p90.txt     LightGBM text model of the 0.9 quantile of log runtime

Each ``.txt`` is LightGBM's own text format. Loading for prediction checks the format and
feature list, reads both texts strictly (:mod:`lgb_text`), compiles them and checks the
compiled code against the scores LightGBM gave at training for the stored check rows;
anything wrong raises :class:`ModelError` naming the file and the reason. A text reaches
LightGBM itself (trainer, offline tools) only through :func:`booster_from_text`, after the
same strict read: LightGBM kills the process on some texts it cannot parse. The trainer
checks the compiled code against LightGBM itself on probe rows before a model can be
promoted.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from celery_aitp.errors import ModelError
from celery_aitp.predict.compiled import CompiledRuntimeModel
from celery_aitp.predict.features import CATEGORICAL, SCHEMA, FeatureSpec
from celery_aitp.predict.lgb_text import parse_model_text
from celery_aitp.predict.request_key import compile_request_key

FORMAT = "celery_aitp.runtime/1"
_FILES = ("meta.json", "p50.txt", "p90.txt")
#: Relative difference allowed between compiled code and LightGBM (both sum doubles).
TOLERANCE = 1e-9
#: Random probe rows the trainer checks against LightGBM before promoting.
PROBES = 512
#: Rows (with LightGBM's scores) the metadata must carry for the publish side's check.
MIN_CHECK_ROWS = 8


class ModelBundle:
    """Metadata and the two model texts, exactly as written by the trainer."""

    def __init__(self, meta: Mapping[str, Any], p50_text: str, p90_text: str,
                 source: str | Path | None = None) -> None:
        self.meta = dict(meta)
        self.p50_text = p50_text
        self.p90_text = p90_text
        #: The directory it was read from (None: from the store, or made in memory).
        self.source = source

    def label(self, which: str) -> str:
        """How errors name one of the two texts (``which``: p50 or p90): with its file."""
        name = f"{which}.txt"
        return f"{which} model ({Path(self.source) / name if self.source else name})"

    @property
    def version(self) -> str:
        return str(self.meta.get("version", ""))

    def save(self, directory: str | Path) -> Path:
        """Write the three files into ``directory`` (created if needed)."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        (path / "meta.json").write_text(json.dumps(self.meta, indent=2, sort_keys=True) + "\n")
        (path / "p50.txt").write_text(self.p50_text)
        (path / "p90.txt").write_text(self.p90_text)
        return path

    @classmethod
    def read(cls, directory: str | Path) -> ModelBundle:
        """Read a model directory; ModelError names what is missing or unreadable."""
        path = Path(directory)
        if not path.is_dir():
            raise ModelError(f"{path}: not a model directory (expected {', '.join(_FILES)})")
        try:
            texts = {name: (path / name).read_text() for name in _FILES}
        except OSError as exc:
            raise ModelError(f"{path}: {exc.strerror or exc}: {exc.filename}") from None
        except UnicodeDecodeError as exc:
            raise ModelError(f"{path}: a model file is not UTF-8 text (byte {exc.start})") \
                from None
        return cls(parse_meta(texts["meta.json"]), texts["p50.txt"], texts["p90.txt"], path)


def parse_meta(text: Any) -> dict[str, Any]:
    try:
        meta = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise ModelError(f"model metadata is not JSON: {exc}") from None
    except RecursionError:
        raise ModelError("model metadata is not JSON: nested too deeply") from None
    if not isinstance(meta, dict):
        raise ModelError("model metadata is not a JSON object")
    return meta


class LoadedModel:
    """A verified model ready for the publish path: feature spec plus compiled forests."""

    def __init__(self, bundle: ModelBundle, spec: FeatureSpec,
                 compiled: CompiledRuntimeModel) -> None:
        self.bundle = bundle
        self.version = bundle.version
        self.spec = spec
        self.compiled = compiled
        #: The cache key straight from a task's arguments (None: build the vector).
        self.request_key = compile_request_key(spec, compiled)
        #: Residual models predict runtime / history estimate; this is the estimate
        #: without any history (None: the model predicts runtime itself).
        self.base_default_s = base_default(bundle.meta)

    def __repr__(self) -> str:
        return f"<LoadedModel {self.version} features={len(self.spec.names)}>"


def base_default(meta: Mapping[str, Any]) -> float | None:
    """``meta['base']['default_s']`` of a residual model, None for a direct one."""
    base = meta.get("base")
    if base is None:
        return None
    value = base.get("default_s") if isinstance(base, dict) else None
    if not isinstance(value, (int, float)) or isinstance(value, bool) \
            or not 0 < value < math.inf:
        raise ModelError(f"model base default must be a positive number, not {value!r}")
    return float(value)


def spec_from_meta(meta: Mapping[str, Any]) -> FeatureSpec:
    """The feature spec a model was trained with; ModelError if this code cannot build it."""
    if meta.get("format") != FORMAT:
        raise ModelError(f"unknown model format {meta.get('format')!r} (expected {FORMAT!r})")
    if meta.get("schema") != SCHEMA:
        raise ModelError(f"feature schema {meta.get('schema')!r}; this version computes {SCHEMA}"
                         " (train a new model: celery -A proj aitp train)")
    try:
        spec = FeatureSpec(
            [str(n) for n in meta.get("kwarg_names", [])],
            [str(n) for n in meta.get("tasks", [])],
            [str(n) for n in meta.get("tenants", [])],
        )
    except TypeError:
        raise ModelError("kwarg_names, tasks and tenants must be lists of names") from None
    names = meta.get("feature_names")
    if list(spec.names) != names:
        raise ModelError(f"feature list {names!r} does not match this version's "
                         f"{list(spec.names)!r}")
    return spec


def booster_from_text(text: str, what: str, feature_names: list[str] | None = None) -> Any:
    """A LightGBM Booster (offline tools and the trainer only), from a text that passed the
    strict reader first, and whose features are ``feature_names`` when given: LightGBM
    aborts the process on some malformed texts (see :mod:`lgb_text`). ``what`` names the
    text in the ModelError."""
    import lightgbm

    _parse(text, what, feature_names)
    try:
        return lightgbm.Booster(model_str=text)
    except Exception as exc:  # LightGBMError and friends: the text is corrupt
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{what} is not a valid LightGBM text model: {first}") from None


def _parse(text: str, what: str, feature_names: list[str] | None) -> dict[str, Any]:
    """The strict read of one text (every path to a model goes through it); ModelError
    prefixed with ``what``."""
    try:
        dump = parse_model_text(text)
    except ModelError as exc:
        raise ModelError(f"{what}: {exc}") from None
    if feature_names is not None and dump["feature_names"] != feature_names:
        raise ModelError(f"{what}: its feature names differ from the metadata's")
    return dump


def load_bundle(bundle: ModelBundle) -> LoadedModel:
    """Check, compile and verify a model; raises ModelError with the reason if unusable.

    Runs in producers and workers, so it needs neither LightGBM nor numpy: the texts are
    read by :func:`parse_model_text` and the compiled code must reproduce the scores
    LightGBM computed for the check rows the trainer stored in the metadata.
    """
    spec = spec_from_meta(bundle.meta)
    if bundle.meta.get("p90") != "offset":
        raise ModelError(f"unknown p90 model kind {bundle.meta.get('p90')!r} (expected 'offset')")
    names = list(spec.names)
    compiled = CompiledRuntimeModel(_parse(bundle.p50_text, bundle.label("p50"), names),
                                    _parse(bundle.p90_text, bundle.label("p90"), names),
                                    len(names))
    verify_check_rows(compiled, bundle.meta, spec)
    return LoadedModel(bundle, spec, compiled)


def verify_check_rows(compiled: CompiledRuntimeModel, meta: Mapping[str, Any],
                      spec: FeatureSpec) -> None:
    """The compiled code must give the scores recorded at training for the check rows."""
    check = meta.get("check")
    if not isinstance(check, Mapping):
        raise ModelError("the metadata has no check rows")
    rows, raw50, raw90 = check.get("rows"), check.get("raw50"), check.get("raw90")
    width = len(spec.names)
    if not (isinstance(rows, list) and isinstance(raw50, list) and isinstance(raw90, list)
            and MIN_CHECK_ROWS <= len(rows) == len(raw50) == len(raw90)):
        raise ModelError(f"the metadata needs at least {MIN_CHECK_ROWS} check rows with scores")
    for row, want50, want90 in zip(rows, raw50, raw90, strict=True):
        if not isinstance(row, list) or len(row) != width:
            raise ModelError("a check row does not have one value per feature")
        try:
            x = [_float(v) for v in row]
            got = compiled.raw(x)
            ok = _close(got[0], float(want50)) and _close(got[1], float(want90))
            compiled.check_key_scores(x)
        except (TypeError, ValueError, OverflowError):
            raise ModelError("a check row holds something other than numbers") from None
        if not ok:
            raise ModelError("model does not reproduce the scores recorded at training")


def verify_with_lightgbm(bundle: ModelBundle, boosters: tuple[Any, Any]) -> None:
    """The trainer's check before promoting: compiled code == LightGBM on probe rows.

    The p90 score is the p50 score plus the p90 (offset) model's score.
    """
    import numpy as np

    loaded = load_bundle(bundle)
    rows = probe_rows(loaded.compiled, loaded.spec)
    matrix = np.array(rows, dtype=np.float64)
    low = boosters[0].predict(matrix, raw_score=True)
    expected = (low, low + boosters[1].predict(matrix, raw_score=True))
    for i, row in enumerate(rows):
        got = loaded.compiled.raw(row)
        for k in (0, 1):
            if not _close(got[k], float(expected[k][i])):
                raise ModelError(f"compiled model disagrees with LightGBM on row {row!r}: "
                                 f"{got[k]!r} != {float(expected[k][i])!r}")


def _float(value: Any) -> float:
    """A recorded check value (JSON null is a missing value)."""
    return math.nan if value is None else float(value)


def _close(a: float, b: float) -> bool:
    return a == b or abs(a - b) <= TOLERANCE * max(1.0, abs(a), abs(b))


def probe_rows(compiled: CompiledRuntimeModel, spec: FeatureSpec,
               count: int = PROBES) -> list[list[float]]:
    """Rows that land on and around every threshold, plus missing values (seeded)."""
    rng = random.Random(1234)  # noqa: S311 - reproducible probes, not security
    choices: list[list[float]] = []
    categorical = {spec.names.index(c) for c in CATEGORICAL}
    for j in range(len(spec.names)):
        values: list[float] = [math.nan, 0.0]
        thresholds = compiled.thresholds.get(j)
        cats = compiled.categories.get(j)
        if thresholds:
            for t in thresholds:
                values.extend((t, math.nextafter(t, math.inf), math.nextafter(t, -math.inf)))
        if cats:
            values.extend(float(c) for c in cats)
            values.append(float(max(cats) + 1))
        if j in categorical and not cats:
            values.append(1.0)
        choices.append(values)
    return [[rng.choice(values) for values in choices] for _ in range(count)]
