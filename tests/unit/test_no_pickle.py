"""No pickle anywhere: not in the package's code, not in Celery's configuration, not in models.

The package source (``celery_aitp`` and ``adapters``) is parsed, not grepped, so a
docstring saying "never pickle" does not count and an aliased import does.
"""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pytest
from celery import Celery

import celery_aitp
from celery_aitp.errors import ModelError
from celery_aitp.predict.bundle import ModelBundle, load_bundle
from celery_aitp.predict.model_source import ModelSource
from celery_aitp.predict.model_store import ModelStore
from celery_aitp.store import RedisStore
from tests.conftest import TEST_POLICY

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(ROOT / "celery_aitp").rglob("*.py"), *(ROOT / "adapters").rglob("*.py")])
#: Modules that deserialise to arbitrary objects (or run code) when they load.
UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "pickletools", "marshal", "shelve", "dill",
                  "cloudpickle", "joblib", "copyreg", "jsonpickle"}
#: Calls that load objects or code: (module alias as written, attribute).
UNSAFE_CALLS = {("yaml", "load"), ("yaml", "unsafe_load"), ("yaml", "full_load"),
                ("np", "load"), ("numpy", "load"), ("torch", "load"), ("pd", "read_pickle"),
                ("pandas", "read_pickle")}
#: Celery settings that would let a serializer other than JSON in.
SERIALIZER_SETTINGS = {"accept_content", "result_accept_content", "task_serializer",
                       "result_serializer", "event_serializer", "CELERY_ACCEPT_CONTENT"}
#: The one module that runs generated code: Python it wrote from numbers it formatted.
EXEC_ALLOWED = {"celery_aitp/predict/compiled.py"}


def docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def problems_in(path: Path, rel: str | None = None) -> list[str]:
    rel = rel or path.relative_to(ROOT).as_posix()
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
    skip = docstrings(tree)
    found = []
    for node in ast.walk(tree):
        where = f"{rel}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            found += [f"{where}: import {a.name}" for a in node.names
                      if a.name.split(".")[0] in UNSAFE_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] \
                in UNSAFE_MODULES:
            found.append(f"{where}: from {node.module} import ...")
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and \
                    (func.value.id, func.attr) in UNSAFE_CALLS:
                found.append(f"{where}: {func.value.id}.{func.attr}()")
            if isinstance(func, ast.Name) and func.id in ("exec", "eval") \
                    and rel not in EXEC_ALLOWED:
                found.append(f"{where}: {func.id}()")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                id(node) not in skip:
            text = node.value.lower()
            if "pickle" in text or "x-python-serialize" in text:
                found.append(f"{where}: string {node.value[:40]!r}")
        if isinstance(node, (ast.Attribute, ast.keyword)):
            name = node.attr if isinstance(node, ast.Attribute) else node.arg
            if name in SERIALIZER_SETTINGS:
                found.append(f"{where}: touches Celery's {name}")
    return found


def test_the_sources_are_found() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in SOURCES}
    assert {"celery_aitp/middleware.py", "celery_aitp/predict/lgb_text.py",
            "adapters/redis_queues.py"} <= names


def test_no_pickle_marshal_shelve_or_object_loading_in_the_package() -> None:
    found = [problem for path in SOURCES for problem in problems_in(path)]
    assert not found, "unsafe deserialisation in the package:\n" + "\n".join(found)


def test_the_scanner_sees_what_it_must_refuse(tmp_path: Path) -> None:
    bad = tmp_path / "probe.py"
    bad.write_text('"""Docstring mentioning pickle is fine."""\n'
                   "import pickle as p\nfrom marshal import loads\nimport yaml\n"
                   "yaml.load('x')\nx = 'application/x-python-serialize'\n"
                   "def f(app):\n    app.conf.accept_content = ['pickle']\n    eval('1')\n")
    found = problems_in(bad, "celery_aitp/probe.py")
    kinds = " ".join(found)
    for expected in ("import pickle", "from marshal", "yaml.load()", "x-python-serialize",
                     "accept_content", "eval()"):
        assert expected in kinds, (expected, found)
    assert not any("Docstring" in f for f in found)


def test_install_leaves_celerys_serializers_alone() -> None:
    plain = Celery("plain", broker="memory://")
    app = Celery("aitp", broker="memory://")
    celery_aitp.install(app, policy=TEST_POLICY)
    app.aitp.pipeline  # noqa: B018 - build what publishing builds
    for name in ("accept_content", "result_accept_content", "task_serializer",
                 "result_serializer", "event_serializer"):
        assert app.conf[name] == plain.conf[name], name
    assert "pickle" not in app.conf.accept_content
    assert "pickle" not in (app.conf.result_accept_content or ())


class _Tripwire:
    """Unpickling this calls ``_tripped``: proves whether anything unpickled it."""

    def __reduce__(self) -> tuple[object, tuple[()]]:
        return (_tripped, ())


TRIPPED: list[bool] = []


def _tripped() -> None:
    TRIPPED.append(True)


@pytest.mark.parametrize("field", ["meta", "p50", "p90"])
def test_a_pickled_model_in_the_store_is_refused_never_unpickled(store: RedisStore, trained,
                                                                  field: str) -> None:
    ModelStore(store).promote(trained.bundle)
    store.client.hset(store.keys.model, field, pickle.dumps(_Tripwire()))
    store.client.hset(store.keys.model, "version", f"pickled-{field}")
    source = ModelSource()
    assert source.fetch(store, None) is None  # refused: cold start, no model
    bundle = ModelBundle(trained.bundle.meta, pickle.dumps(_Tripwire()).decode("latin-1"),
                         trained.bundle.p90_text)
    with pytest.raises(ModelError):
        load_bundle(bundle)
    assert TRIPPED == []


@pytest.mark.parametrize(("node", "message"), [
    ({"threshold": "__import__('os').getcwd()", "decision_type": "<="}, "threshold"),
    ({"threshold": "1||__import__('os')", "decision_type": "=="}, "categorical split"),
    ({"threshold": 1.0, "decision_type": "<= 0 or __import__('os') or"}, "decision type"),
    ({"threshold": 1.0, "decision_type": "<=", "split_feature": "0; import os"},
     "split on feature"),
])
def test_the_compiled_model_code_takes_only_numbers_from_the_model(node, message) -> None:
    """The one exec in the package: model text that is not numbers never reaches it."""
    from celery_aitp.predict.compiled import compile_forest

    split = {"split_feature": 0, "default_left": True, "missing_type": "None",
             "left_child": {"leaf_value": 1.0}, "right_child": {"leaf_value": 2.0}, **node}
    with pytest.raises(ModelError, match=message):
        compile_forest({"tree_info": [{"tree_structure": split}]}, 1)
