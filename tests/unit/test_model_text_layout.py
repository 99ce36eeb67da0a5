"""What LightGBM's own loader relies on is checked before any model text reaches it.

LightGBM finds tree ``i`` at the byte offset the ``tree_sizes`` header gives, and reads each
tree's arrays by ``num_leaves``. A text edited after LightGBM wrote it (a space added, a
value rounded) or with an array of the wrong length kills the process inside LightGBM
(SIGSEGV, or "terminate called"): the trainer scoring the model in use, ``celery-aitp
predict``. So a test that could hand such a text to LightGBM does it in a subprocess, or
replaces ``lightgbm.Booster`` with a test failure: ModelError must come first.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import lightgbm
import numpy as np
import pytest

import celery_aitp
from celery_aitp.errors import ModelError
from celery_aitp.learn.promotion import promotion_refusal
from celery_aitp.learn.train import bundle_boosters, predict_log
from celery_aitp.predict.bundle import ModelBundle, booster_from_text, load_bundle
from celery_aitp.predict.lgb_text import parse_model_text
from celery_aitp.predict.model_store import ModelStore
from tests.unit.test_compiled import booster, data

ROOT = Path(celery_aitp.__file__).resolve().parents[1]


def with_tree_sizes(text: str) -> str:
    """``text`` with ``tree_sizes`` recounted as LightGBM counts it: the bytes from each
    ``Tree=`` line to the next one (or ``end of trees``), separators included."""
    lines = text.split("\n")
    starts = [i for i, line in enumerate(lines) if line.startswith("Tree=")]
    starts.append(lines.index("end of trees"))
    sizes = [sum(len(line.encode()) + 1 for line in lines[a:b])
             for a, b in zip(starts, starts[1:], strict=False)]
    return re.sub(r"^tree_sizes=.*$", "tree_sizes=" + " ".join(map(str, sizes)), text,
                  count=1, flags=re.M)


def edit_line(text: str, key: str, edit: Any) -> str:
    """``text`` with ``edit(values)`` applied to the first ``key=`` line's values."""
    lines = text.split("\n")
    i = next(k for k, line in enumerate(lines) if line.startswith(key + "="))
    lines[i] = key + "=" + edit(lines[i].partition("=")[2])
    return "\n".join(lines)


def trailing_spaces(values: str) -> str:
    return values + "   "


def rounded(values: str) -> str:
    first, _, rest = values.partition(" ")
    return f"{round(float(first), 3)!r} {rest}"


@pytest.fixture
def no_lightgbm(monkeypatch: pytest.MonkeyPatch) -> None:
    """LightGBM must not be given the text: fail the test (not the process) if it is."""
    def refuse(*_: Any, **__: Any) -> None:
        pytest.fail("the text reached lightgbm.Booster before being refused")

    monkeypatch.setattr(lightgbm, "Booster", refuse)


def _categorical() -> lightgbm.Booster:
    x, y = data(1500)
    return booster(x, y, rounds=8, zero_as_missing=True)


def _one_leaf() -> lightgbm.Booster:
    return lightgbm.train({"objective": "regression", "verbose": -1},
                          lightgbm.Dataset(np.zeros((50, 2)), np.ones(50),
                                           params={"verbose": -1}), 2)


# --- a genuine model --------------------------------------------------------------------

def test_a_model_trained_and_saved_by_the_trainer_loads_and_predicts_as_at_training(
        trained, tmp_path):
    bundle = ModelBundle.read(trained.bundle.save(tmp_path / "model"))  # written, read back
    assert "\r" not in bundle.p50_text and bundle.p50_text.count("\nTree=") > 1
    load_bundle(bundle)
    check = bundle.meta["check"]
    rows = np.array([[math.nan if v is None else v for v in row] for row in check["rows"]])
    low, high = predict_log(bundle_boosters(bundle), rows)
    assert low.tolist() == check["raw50"] and high.tolist() == check["raw90"]


@pytest.mark.parametrize("make", [_categorical, _one_leaf])
def test_other_models_saved_by_lightgbm_load_and_predict_identically(make):
    model = make()
    text = model.model_to_string()
    names = parse_model_text(text)["feature_names"]
    rows = np.random.default_rng(3).normal(size=(200, len(names))) * 10
    rows[::4, 0] = np.nan
    rows[:, 0] = np.where(np.isnan(rows[:, 0]), np.nan, np.abs(np.round(rows[:, 0])))
    assert booster_from_text(text, "model", names).predict(rows, raw_score=True).tolist() \
        == model.predict(rows, raw_score=True).tolist()


# --- tree_sizes ---------------------------------------------------------------------------

@pytest.mark.parametrize("edit, size", [(trailing_spaces, 3), (rounded, None)])
def test_an_edit_that_leaves_tree_sizes_stale_is_refused_before_lightgbm(
        trained, tmp_path, no_lightgbm, edit, size):
    directory = trained.bundle.save(tmp_path / "model")
    p50 = directory / "p50.txt"
    p50.write_text(edit_line(p50.read_text(), "leaf_value", edit))
    bundle = ModelBundle.read(directory)
    with pytest.raises(ModelError, match="tree_sizes says tree 0 is") as caught:
        parse_model_text(bundle.p50_text)
    if size is not None:  # three spaces: the block is three bytes longer than listed
        listed, actual = map(int, re.findall(r"(\d+) bytes but it is (\d+)",
                                             str(caught.value))[0])
        assert actual == listed + size
    file = re.escape(str(directory / "p50.txt"))
    with pytest.raises(ModelError, match=f"p50 model \\({file}\\): tree_sizes says"):
        load_bundle(bundle)
    with pytest.raises(ModelError, match=f"p50 model \\({file}\\): tree_sizes says"):
        bundle_boosters(bundle)
    with pytest.raises(ModelError, match="tree_sizes says"):
        booster_from_text(bundle.p50_text, "p50 model")


@pytest.mark.parametrize("edit, message", [
    (lambda sizes: sizes.rpartition(" ")[0], "tree_sizes lists 39 sizes for 40 trees"),
    (lambda sizes: sizes + " 100", "tree_sizes lists 41 sizes for 40 trees"),
    (lambda sizes: "99999999 " + sizes.partition(" ")[2], "says tree 0 is 99999999 bytes"),
    (lambda sizes: str(int(sizes.partition(" ")[0]) + 1) + " " + sizes.partition(" ")[2],
     "says tree 0 is \\d+ bytes"),
    (lambda sizes: "x " + sizes.partition(" ")[2], "tree_sizes is not a list of byte counts"),
    (lambda sizes: sizes.replace(" ", "\t", 1), "tree_sizes is not a list of byte counts"),
])
def test_tree_sizes_with_a_wrong_count_or_number_are_refused(trained, no_lightgbm, edit,
                                                             message):
    text = edit_line(trained.bundle.p50_text, "tree_sizes", edit)
    with pytest.raises(ModelError, match=message):
        parse_model_text(text)
    with pytest.raises(ModelError, match=message):
        booster_from_text(text, "current p50 model")


def test_a_model_without_tree_sizes_is_refused(trained):
    text = re.sub(r"^tree_sizes=.*\n", "", trained.bundle.p50_text, count=1, flags=re.M)
    with pytest.raises(ModelError, match="the header has no tree_sizes"):
        parse_model_text(text)


# --- per-tree arrays and what else LightGBM reads --------------------------------------

@pytest.mark.parametrize("key", ["split_gain", "internal_value", "internal_weight",
                                 "internal_count", "leaf_weight", "leaf_count"])
@pytest.mark.parametrize("change", ["drop", "add"])
def test_every_per_tree_array_must_have_one_value_per_node_or_leaf(trained, no_lightgbm, key,
                                                                   change):
    """tree_sizes recounted: only the array's length is wrong. LightGBM aborts on a
    leaf_weight of the wrong length; the others it pads with zeros or cuts short, silently
    reading another model than the text says."""
    text = trained.bundle.p50_text
    length = len(re.search(f"^{key}=(.*)$", text, re.M).group(1).split())
    text = with_tree_sizes(edit_line(
        text, key, (lambda v: v.rpartition(" ")[0]) if change == "drop" else (lambda v: v + " 1")))
    got = length - 1 if change == "drop" else length + 1
    with pytest.raises(ModelError, match=f"{key}: {got} values, expected {length}"):
        parse_model_text(text)
    with pytest.raises(ModelError, match=f"current p50 model: {key}"):
        booster_from_text(text, "current p50 model")


@pytest.mark.parametrize("spoil, message", [
    # each of these kills the process in LightGBM 4 (abort, SIGSEGV or SIGFPE)
    (lambda t: t.replace("\nnum_cat=1\n", "\n", 1), "num_cat: not an integer"),
    (lambda t: t.replace("\nnum_cat=1\n", "\nnum_cat=1\n\n", 1), "after its first empty line"),
    (lambda t: t.replace("\nshrinkage=1\n\n", "\nshrinkage=1\nTree=x\n\n", 1),
     "does not end with an empty line"),
    (lambda t: edit_line(t, "objective", lambda v: ""), "objective '' is not"),
    (lambda t: edit_line(t, "num_tree_per_iteration", lambda v: "0"), "single-output"),
    (lambda t: edit_line(t, "num_tree_per_iteration", lambda v: "100"), "single-output"),
    (lambda t: t.replace("\n[boosting: gbdt]\n", "\n:\n", 1), "malformed parameter line"),
    (lambda t: t.replace("\n[boosting: gbdt]\n", "\n[x]\n", 1), "malformed parameter line"),
    # these LightGBM reads otherwise than this reader would (another model, or offsets
    # counted with the carriage returns the sizes did not include)
    (lambda t: t.replace("\nis_linear=0\n", "\nis_linear\n", 1), "is not key=value"),
    (lambda t: edit_line(t, "leaf_value", lambda v: "1_0 " + v.partition(" ")[2]),
     "leaf_value: malformed"),
    (lambda t: t.replace("\n", "\r\n"), "carriage return"),
])
def test_what_lightgbm_crashes_on_or_misreads_is_refused(trained, no_lightgbm, spoil,
                                                         message):
    """tree_sizes recounted first (but for the carriage returns), so the check tested is
    the one after it."""
    text = spoil(trained.bundle.p50_text)
    text = with_tree_sizes(text) if "\r" not in text else text
    with pytest.raises(ModelError, match=message):
        parse_model_text(text)
    with pytest.raises(ModelError, match=message):
        booster_from_text(text, "p50 model")


# --- nothing the reader accepts crashes LightGBM --------------------------------------

_LOAD_ALL = """
import json, sys
import lightgbm, numpy as np
for i, text in enumerate(json.load(open(sys.argv[1]))):
    print("loading", i, file=sys.stderr, flush=True)
    try:
        model = lightgbm.Booster(model_str=text)
        model.predict(np.full((4, model.num_feature()), np.nan), raw_score=True)
        model.predict(np.zeros((4, model.num_feature())), raw_score=True)
    except Exception:
        pass
"""

_TOKENS = ["", "-1", "0", "1", "7", "30", "999999", "x", "nan", "inf", "-inf", "1e400", "1.5",
           "=", ":", "[x]", "4294967296"]


def _mutant(texts: list[str], rng: random.Random) -> str:
    lines = rng.choice(texts).split("\n")
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(1, len(lines))
        roll = rng.random()
        if roll < 0.5:
            key, sep, value = lines[i].partition("=")
            parts = value.split(" ")
            j = rng.randrange(len(parts))
            if rng.random() < 0.3:
                del parts[j]
            else:
                parts[j] = rng.choice(_TOKENS)
            lines[i] = key + sep + " ".join(parts)
        elif roll < 0.65:
            del lines[i]
        elif roll < 0.8:
            lines.insert(i, lines[i])
        else:
            lines.insert(i, rng.choice(["", ":", "[x]", "num_cat=1", "leaf_value=1",
                                        "is_linear=1", "Tree=0", "end of trees"]))
    text = "\n".join(lines)
    return with_tree_sizes(text) if rng.random() < 0.8 and "end of trees" in lines else text


def test_no_text_the_reader_accepts_crashes_lightgbm(trained, tmp_path):
    """Stale and edited texts, and seeded random edits of real models (most with
    tree_sizes recounted, so the checks after it are what is tested): every text
    parse_model_text accepts is loaded and used by LightGBM in a child process, which
    must not die."""
    bundle = trained.bundle
    texts = [bundle.p50_text, bundle.p90_text, _categorical().model_to_string(),
             _one_leaf().model_to_string()]
    candidates = [
        edit_line(bundle.p50_text, "leaf_value", trailing_spaces),
        edit_line(bundle.p50_text, "leaf_value", rounded),
        edit_line(bundle.p50_text, "tree_sizes", lambda s: "99999999 " + s.partition(" ")[2]),
        with_tree_sizes(edit_line(bundle.p50_text, "leaf_weight", lambda v: v[:-3])),
    ]
    rng = random.Random(20240611)
    candidates += [_mutant(texts, rng) for _ in range(400)]
    accepted = list(texts)
    for text in candidates:
        try:
            parse_model_text(text)
        except ModelError:
            continue
        accepted.append(text)
    path = tmp_path / "texts.json"
    path.write_text(json.dumps(accepted))
    run = subprocess.run([sys.executable, "-c", _LOAD_ALL, str(path)], capture_output=True,
                         text=True, timeout=300, check=False)
    last = [line for line in run.stderr.splitlines() if line.startswith("loading ")][-1:]
    assert run.returncode == 0, (
        f"LightGBM died (exit {run.returncode}) {last} of {len(accepted)} accepted texts: "
        f"{run.stderr[-300:]}")


# --- the trainer and the CLI ------------------------------------------------------------

def test_the_trainer_carries_on_when_the_model_in_use_cannot_be_loaded(store, trained,
                                                                       no_lightgbm):
    models = ModelStore(store)
    stale = ModelBundle({**trained.bundle.meta, "version": "v-edited"},
                        edit_line(trained.bundle.p50_text, "leaf_value", trailing_spaces),
                        trained.bundle.p90_text)
    models.promote(stale)  # what a hand-edited model pinned or promoted by hand would be
    assert trained.promotable
    said: list[str] = []
    assert promotion_refusal(models, trained, say=said.append) is None
    assert len(said) == 1 and "the current model cannot be read or scored" in said[0]
    assert "current p50 model (p50.txt): tree_sizes says tree 0" in said[0]


def test_celery_aitp_predict_reports_an_edited_model_and_exits(trained, tmp_path,
                                                               synthetic_records):
    directory = trained.bundle.save(tmp_path / "m2")
    p50 = directory / "p50.txt"
    p50.write_text(edit_line(p50.read_text(), "leaf_value", rounded))
    runs = tmp_path / "runs.jsonl"
    runs.write_text("".join(json.dumps(r) + "\n" for r in synthetic_records[:20]))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    run = subprocess.run([sys.executable, "-m", "celery_aitp", "predict", "--model",
                          str(directory), "--observations", str(runs)],
                         capture_output=True, text=True, env=env, timeout=300, check=False)
    assert run.returncode == 2, (run.returncode, run.stderr[-500:])
    assert run.stdout == "" and "Traceback" not in run.stderr
    assert run.stderr.startswith(f"error: p50 model ({p50}): tree_sizes says tree 0 is ")
