"""train.py and eval.py as a user runs them: run directories, wandb files, multirun, signals."""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from flax import nnx
from omegaconf import OmegaConf

from conftest import ROOT, TINY, check_run_record, entry_devices, quick_only, run_entry, wandb_run


def test_train_writes_everything_a_run_directory_holds(tmp_path):
    done = run_entry("train.py", *TINY, "logger=offline", f"hydra.run.dir={tmp_path}",
                     env={**os.environ, "WANDB_MODE": "offline"})
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (tmp_path / ".hydra" / "config.yaml").exists()
    assert (tmp_path / "checkpoints" / str(summary["checkpoint_step"]) / "state").is_dir()
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1 and runs[0].stat().st_size > 0
    assert summary["wandb_dir"] == str(runs[0].parent)
    record = wandb_run(tmp_path)  # a single run is its own group, its config the run's (a sweep's job adds more)
    assert record["group"] == tmp_path.name and "multirun" not in record["config"]
    assert record["config"]["model"]["width"] == 16
    assert record["config"]["resolved"]["layer"] == "tmem.mixers.attention.SoftmaxAttention"  # and the run's record
    devices = entry_devices(*TINY)  # the default: one per core, as many as split the batch
    assert summary["devices"] == devices
    for line in ("checkpoint:", "wandb:", "run:", "eval/accuracy=", f"training on {devices} cpu device"):
        assert line in done.stdout
    check_run_record(tmp_path, done.stdout, [*TINY, "logger=offline"])  # metrics.jsonl, train.log, resolved.yaml


@pytest.mark.slow
def test_multirun_gives_each_job_its_own_directory(tmp_path):
    # two seeds, one program: the second job compiles nothing (two widths would compile everything twice)
    done = run_entry("train.py", "-m", *TINY, "train.steps=5", "train.seed=0,1", f"hydra.sweep.dir={tmp_path}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert [OmegaConf.load(tmp_path / str(i) / ".hydra" / "config.yaml").train.seed for i in (0, 1)] == [0, 1]
    for i in (0, 1):
        assert json.loads((tmp_path / str(i) / "summary.json").read_text())["steps"] == 5


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_resume_finishes(tmp_path):
    args = [*TINY, "train.steps=100000", "train.checkpoint_every=100000", "train.early_stop=false",
            f"hydra.run.dir={tmp_path}"]
    log = tmp_path.parent / f"{tmp_path.name}.stderr"
    with open(log, "w") as stderr:
        proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=stderr, text=True)
        deadline = time.time() + 120
        while "loss=" not in log.read_text() and time.time() < deadline:  # the progress bar shows a logged step
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    err = log.read_text()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["checkpoint_step"] == summary["steps"] > 0
    step = summary["steps"]
    # the decay ends where the run's did: a resume may not move it (tests/test_rundir.py)
    done = run_entry("train.py", *args[:-4], f"train.steps={step + 10}", "optim.decay_steps=100000",
                     "train.resume=true", f"hydra.run.dir={tmp_path}")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["resumed_from"] == step and summary["steps"] == step + 10


@pytest.mark.slow  # 15 s with the run it trains; the quick subset runs eval.py on a missing run (below)
def test_eval_writes_report_and_figure(tiny_run):
    done = run_entry("eval.py", f"run={tiny_run}", "probes=[mqar_distance]", "logger=disabled")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tiny_run / "eval" / "report.json").read_text())
    assert report["step"] == 30 and report["run"] == str(tiny_run)
    rows = report["mqar_distance"]
    assert sum(rows["count"]) == 64 * 2  # every held-out query lands in one bin
    assert (tiny_run / "eval" / "mqar_distance.png").stat().st_size > 0


@pytest.mark.slow  # a second eval process
def test_eval_restores_any_checkpoint_step(tiny_run):
    done = run_entry("eval.py", f"run={tiny_run}", "step=10", "probes=[mqar_distance]", "logger=disabled")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tiny_run / "eval" / "report.json").read_text())["step"] == 10


# a process each: the quick subset keeps one, and one that needs no trained run
@pytest.mark.parametrize("args, message", quick_only([
    pytest.param(["run={tmp}/nothing"], "error: run={tmp}/nothing: no such directory", id="no-run"),
    pytest.param(["run={tmp}"], "has no checkpoints/ folder", id="no-checkpoints"),
    pytest.param(["run={run}", "probes=[nope]"], "error: probes: unknown probe 'nope'; allowed: mqar_distance, ",
                 id="unknown-probe"),
    pytest.param(["probes=[mqar_distance]"],
                 "error: probe 'mqar_distance' needs a trained model: pass run=<run dir>", id="needs-a-run"),
], {"no-run"}))
def test_eval_errors_are_one_line(request, tmp_path, args, message):
    run = request.getfixturevalue("tiny_run") if any("{run}" in a for a in args) else None  # trained if read
    fill = lambda s: s.format(tmp=tmp_path, run=run)  # noqa: E731
    done = run_entry("eval.py", *map(fill, args), *(["probes=[mqar_distance]"] if len(args) == 1 and
                                                      "probes" not in args[0] else []), "logger=disabled")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert fill(message) in last and "Traceback" not in done.stderr


KILLED_AFTER_A_CHECKPOINT = """
import os, runpy, signal, sys
from tmem.train.checkpoint import Checkpoints

save = Checkpoints.save
def save_then_die(self, state, metrics=None):
    save(self, state, metrics)
    if int(state.step) == 10:  # the named point: just after the step-10 checkpoint, mid-run
        os.kill(os.getpid(), signal.SIGKILL)
Checkpoints.save = save_then_die
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


@pytest.mark.slow
def test_a_kill_during_training_resumes_exactly(tmp_path):
    from tmem.train.restore import load_run

    args = ["train.early_stop=false", "train.checkpoint_every=10"]  # 20 steps
    killed = subprocess.run([sys.executable, "-c", KILLED_AFTER_A_CHECKPOINT, *TINY, *args,
                             f"hydra.run.dir={tmp_path / 'a'}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    done = run_entry("train.py", *TINY, *args, "train.resume=true", f"hydra.run.dir={tmp_path / 'a'}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["resumed_from"] == 10
    # the same run straight through, on the same devices (a CPU's cores: summing over another number of devices
    # orders the gradient's sums differently)
    straight = run_entry("train.py", *TINY, *args, f"hydra.run.dir={tmp_path / 'b'}")
    assert straight.returncode == 0, straight.stderr[-3000:]
    resumed, straight = (load_run(tmp_path / run_dir).model for run_dir in ("a", "b"))
    for a, b in zip(jax.tree.leaves(nnx.state(resumed)), jax.tree.leaves(nnx.state(straight))):
        np.testing.assert_array_equal(a, b)
