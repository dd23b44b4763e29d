"""Every run's record on disk: metrics.jsonl (tmem.train.record), train.log, and the resolved run
(tmem.train.resolved) in resolved.yaml and summary.json."""

import json
import shutil
import subprocess
from types import SimpleNamespace

import flax
import jax
import numpy as np
import optax
import orbax.checkpoint
import pytest
import yaml

from conftest import ROOT, TINY, check_run_record, compose_config, run_entry
from tmem.config import validate
from tmem.train.mesh import describe
from tmem.train.record import METRICS, MetricsFile, read_metrics
from tmem.train.resolved import _commit, run_record, versions_of


@pytest.mark.slow  # 15 to 30 s: a run of train.py; the quick subset checks the same record with logger=offline
def test_a_20_step_run_keeps_its_curve_and_log_with_logger_disabled(tmp_path):
    overrides = [*TINY, "train.early_stop=false"]  # TINY's logger is disabled
    done = run_entry("train.py", *overrides, f"hydra.run.dir={tmp_path}")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = check_run_record(tmp_path, done.stdout, overrides)
    assert [(line["step"], "eval/loss" in line) for line in lines] == [
        (5, False), (10, False), (10, True), (15, False), (20, False), (20, True)]


def test_the_record_holds_what_a_regression_cell_resolved_to_not_its_knobs():
    overrides = [*TINY, "mixer=regression", "mixer.function=mlp", "mixer.optimizer=sgd", "optim.lr=null"]
    composed = compose_config(overrides)
    assert composed.mixer.mini_batch == 16  # what .hydra/config.yaml records
    cfg = validate(composed)
    record = run_record(cfg, {"devices": 1}, {})
    assert record["resolved"]["layer"] == "tmem.mixers.titans.Titans"
    assert record["resolved"]["mixer"]["mini_batch"] == 1  # SGD: a gradient step per token
    assert record["resolved"]["model"]["positions"] == cfg.model.positions != "auto"
    assert record["recipe"]["lr"] == composed.mixer.recipe.lr and record["recipe"]["decay_end"] == 20
    assert record["recipe"]["microbatch"] == cfg.mixer.recipe.microbatch  # train.microbatch=auto takes the row's
    assert json.loads(json.dumps(record)) == record == yaml.safe_load(yaml.safe_dump(record))  # plain values only


def test_the_versions_are_the_installed_ones_and_the_commit_the_checkout(tmp_path):
    assert _commit(tmp_path) == {"commit": None, "dirty": None}  # no checkout there: no commit, and no failure
    versions = versions_of()
    assert (versions["jax"], versions["flax"], versions["optax"], versions["orbax"]) == (
        jax.__version__, flax.__version__, optax.__version__, orbax.checkpoint.__version__)
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        assert versions["commit"] is None
        return
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert versions["commit"] == head.stdout.strip() and isinstance(versions["dirty"], bool)


def test_the_device_line_names_an_accelerator_by_its_kind():
    gpu = SimpleNamespace(platform="gpu", device_kind="NVIDIA H200", process_index=0)
    mesh = SimpleNamespace(devices=np.array([gpu, gpu], dtype=object), size=2)
    assert describe(mesh, 64).startswith("training on 2 gpu devices (NVIDIA H200): each batch of 64 split 32")
    mesh = SimpleNamespace(devices=np.array([gpu], dtype=object), size=1)
    assert describe(mesh, 64) == "training on 1 gpu device (NVIDIA H200): the whole batch of 64 on it"


def test_a_resumed_metrics_file_drops_the_steps_past_its_checkpoint(tmp_path):
    written = MetricsFile(tmp_path, 0)
    for step in (5, 10, 15, 20):
        written.write(step, {"wall_seconds": step / 10, "lr": 0.1, "train/loss": 1 / step})
    written.close()
    with open(tmp_path / METRICS, "a") as f:
        f.write('{"step": 25, "wall_')  # the process killed in the middle of a line
    assert [line["step"] for line in read_metrics(tmp_path)] == [5, 10, 15, 20]  # the cut line is left out

    resumed = MetricsFile(tmp_path, 10)  # the run continues from its checkpoint at step 10
    assert [line["step"] for line in read_metrics(tmp_path)] == [5, 10]
    resumed.write(15, {"wall_seconds": 2.0, "lr": 0.1, "train/loss": 0.5})
    resumed.close()
    lines = read_metrics(tmp_path / METRICS)
    assert [line["step"] for line in lines] == [5, 10, 15] and lines[-1]["train/loss"] == 0.5
    assert list(tmp_path.iterdir()) == [tmp_path / METRICS]  # the rewrite left nothing beside it

    (tmp_path / METRICS).write_text('{"step": 5}\nnot json\n{"step": 10}\n')
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        read_metrics(tmp_path)


@pytest.mark.slow  # two sessions of a tiny run: 10 s
def test_a_resumed_run_rewrites_the_lines_a_killed_session_wrote_past_its_checkpoint(tiny_cfg, tmp_path):
    from tmem.train.loop import run

    common = ("train.steps=20", "train.early_stop=false", "train.checkpoint_every=100")
    cfg, resolved = tiny_cfg(*common, "train.stop_after=10")
    run(cfg, tmp_path, resolved)  # a checkpoint at step 10
    with open(tmp_path / METRICS, "a") as f:  # what a session killed before its next checkpoint had logged
        f.write(json.dumps({"step": 15, "wall_seconds": 99.0, "lr": 1.0, "train/loss": -1.0}) + "\n")
    cfg, resolved = tiny_cfg(*common, "train.resume=true")
    summary = run(cfg, tmp_path, resolved)
    lines = read_metrics(tmp_path)
    assert [(line["step"], "eval/loss" in line) for line in lines] == [
        (5, False), (10, False), (10, True), (15, False), (20, False), (20, True)]
    assert all(line["train/loss"] > 0 for line in lines if "train/loss" in line)  # the stale line is gone
    seconds = [line["wall_seconds"] for line in lines]
    assert seconds == sorted(seconds) and seconds[-1] <= summary["wall_seconds"]  # earlier sessions' time counts
