"""Run directories: every bad command is one line before anything is written, and a run is claimed once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from conftest import ROOT, TINY, compose_config, run_entry
from tmem.config import ConfigError, validate
from tmem.train import rundir
from tmem.train.checkpoint import FINISHED


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished_record(tmp_path_factory) -> Path:
    """The record of a finished TINY run: Hydra's config, a summary, a checkpoint step carrying the config."""
    run = tmp_path_factory.mktemp("record") / "run"
    (run / ".hydra").mkdir(parents=True)
    cfg = compose_config(TINY)
    (run / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    (run / "summary.json").write_text('{"status": "completed", "steps": 20}\n')
    (run / rundir.CLAIM).write_text('{"pid": 1}\n')
    step = run / "checkpoints" / "20"
    step.mkdir(parents=True)
    (step / FINISHED).write_text(json.dumps({"custom_metadata": {"config": OmegaConf.to_container(cfg, resolve=True)}}))
    return run


@pytest.fixture
def finished_run(finished_record, tmp_path) -> Path:
    """A copy of the record for one test (composed once per module: composing costs more than copying)."""
    return Path(shutil.copytree(finished_record, tmp_path / "run"))


# Each command must stop with one ConfigError line naming the problem and its fix, before Hydra writes anything.
# {run} is a finished run, {file} a plain file, {sweep} a sweep folder holding a job.
BAD = [
    # counts, probabilities, betas and sizes
    (["task.num_kv_pairs=0"], "task.num_kv_pairs must be at least 1"),
    (["task.heldout_size=0"], "task.heldout_size must be at least 1"),
    (["task.num_passes=0"], "task.num_passes must be at least 1"),
    (["task.vocab=abc"], "task.vocab"),
    (["task.seq_len=6"], "task.num_kv_pairs too large"),
    (["task.num_kv_pairs=40"], "task.num_kv_pairs"),
    (["optim.warmup_steps=-10"], "optim.warmup_steps=-10 must be zero or more"),
    (["optim.b1=1.5"], "optim.b1=1.5 must be in [0, 1)"),
    (["optim.b2=1.0"], "optim.b2=1.0 must be in [0, 1)"),
    (["optim.weight_decay=-0.1"], "optim.weight_decay=-0.1 must be zero or more"),
    (["optim.lr=0"], "optim.lr=0.0 must be positive"),
    (["optim.lr=-1e-3"], "optim.lr=-0.001 must be positive"),
    (["optim.eps=0"], "optim.eps=0.0 must be positive"),
    (["optim.clip_norm=0"], "optim.clip_norm=0.0 must be positive"),
    (["optim.final_lr_ratio=-1"], "optim.final_lr_ratio=-1.0 must be zero or more"),
    (["optim.schedule=step"], "optim.schedule='step' is not one of"),
    (["train.steps=0"], "train.steps=0 must be positive"),
    (["train.batch_size=0"], "train.batch_size=0 must be positive"),
    (["train.microbatch=3"], "train.microbatch=3 must divide train.batch_size=16"),
    (["train.eval_every=0"], "train.eval_every=0 must be positive"),
    (["train.log_every=-1"], "train.log_every=-1 must be positive"),
    (["train.checkpoint_every=0"], "train.checkpoint_every=0 must be positive"),
    (["train.keep_checkpoints=0"], "train.keep_checkpoints=0 must be positive"),
    (["train.diverge_factor=0"], "train.diverge_factor=0.0 must be positive"),
    (["train.diverge_patience=0"], "train.diverge_patience=0 must be positive"),
    (["model.width=0"], "model.width=0 must be positive"),
    (["model.depth=0"], "model.depth=0 must be positive"),
    (["model.width=15"], "mixer.heads=2 must divide model.width=15"),
    (["mixer.heads=0"], "mixer.heads=0"),
    (["mlp=relu", "mlp.expansion=0"], "mlp.expansion=0.0 must be positive"),
    (["logger.mode=maybe"], "logger.mode='maybe' is not one of"),
    # choices, fields and groups
    (["model.positions=sideways"], "model.positions='sideways' is not one of"),
    (["model.norm=batch"], "model.norm='batch' is not one of"),
    (["mixer=linear", "mixer.decay=sometimes"], "mixer.decay='sometimes' is not one of"),
    (["mixer=linear", "mixer.run.chunk=0"], "mixer.run.chunk=0"),
    # a field's name from before the row's recipe and run were parts of their own, a sweep's too
    (["mixer=linear", "mixer.chunk=0"], "mixer.chunk is now mixer.run.chunk: a row's recipe"),
    (["-m", "mixer.lr=1e-3,3e-3"], "mixer.lr is now mixer.recipe.lr"),
    (["mlp=nope"], "mlp=nope: no such option; allowed:"),
    (["mixer=nope"], "mixer=nope: no such option; allowed:"),
    (["task=nope"], "task=nope: no such option; allowed:"),
    (["+train.nonsense=1"], "train.nonsense: unknown field; allowed:"),
    (["train.nonsense=1"], "Could not override 'train.nonsense'"),
    (["model.width=[1,2"], "model.width=[1,2: no viable alternative at input '[1,2' (see the override grammar"),
    # task and model that do not fit together
    (["mixer=linear", "model.positions=rope"], "model.positions=rope: mixer 'linear' does not apply RoPE"),
    (["mixer=linear", "model.positions=shortformer"], "model.positions=shortformer: mixer 'linear' has no query"),
    (["task=linreg"], "Could not override 'task.vocab'. To append to your config use +task.vocab=32"),
    # output directories
    (["hydra.run.dir={file}"], "hydra.run.dir={file} is a file, not a directory"),
    (["-m", "hydra.sweep.dir={file}"], "hydra.sweep.dir={file} is a file, not a directory"),
    (["-m", "hydra.sweep.dir={sweep}"], "hydra.sweep.dir={sweep} already holds a sweep"),
    (["hydra.run.dir={run}"], "hydra.run.dir={run} already holds a run: continue it with train.resume=true"),
    (["hydra.run.dir={run}", "train.seed=1"], "already holds a run"),
    (["hydra.run.dir={run}", "optim.b1=1.5"], "optim.b1=1.5 must be in [0, 1)"),
    # resumes that would make the run describe two runs
    (["hydra.run.dir={run}", "train.resume=true", "model.width=32"], "changes model.width (16 -> 32)"),
    (["hydra.run.dir={run}", "train.resume=true", "train.seed=1"], "changes train.seed (0 -> 1)"),
    (["hydra.run.dir={run}", "train.resume=true", "mixer=linear"], "changes mixer."),
    (["hydra.run.dir={run}", "train.resume=true", "task.vocab=64"], "changes task.vocab (32 -> 64)"),
    (["hydra.run.dir={run}", "train.resume=true", "optim.lr=0.5"], "changes optim.lr"),
    (["hydra.run.dir={run}", "train.resume=true", "train.batch_size=32"], "changes train.batch_size (16 -> 32)"),
    (["hydra.run.dir={run}", "train.resume=true", "optim.b1=1.5"], "optim.b1=1.5 must be in [0, 1)"),
    (["hydra.run.dir={run}", "train.resume=true", "train.steps=40"], "decay from step 20 to 40"),
]


@pytest.mark.parametrize("args, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_command_is_one_line_and_changes_nothing(args, message, finished_run, tmp_path):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("kept")
    sweep = tmp_path / "sweep"
    (sweep / "0").mkdir(parents=True)
    fill = lambda s: s.format(run=finished_run, file=a_file, sweep=sweep)  # noqa: E731
    before = snapshot(tmp_path)
    base = [*TINY] if any(a.startswith("hydra.run.dir=") for a in args) else [*TINY, f"hydra.run.dir={tmp_path}/new"]
    with pytest.raises(ConfigError) as raised:
        rundir.prepare(base + [fill(a) for a in args])
    line = str(raised.value)
    assert fill(message) in line and "\n" not in line
    assert snapshot(tmp_path) == before and not (tmp_path / "new").exists()


# eval.py's requests, checked before Hydra writes the run's eval folder. {run} is the finished run, {empty} a
# directory holding nothing.
BAD_EVAL = [
    (["run={tmp}/nothing", "probes=[mqar_distance]"], "run={tmp}/nothing: no such directory"),
    (["run={empty}", "probes=[mqar_distance]"], "has no checkpoints/ folder: point run= at a training run directory"),
    (["run={run}", "probes=[nope]"], "probes: unknown probe 'nope'; allowed: "),
    (["run={run}"], "probes: name at least one; allowed: "),
    (["probes=[mqar_distance]"], "probe 'mqar_distance' needs a trained model: pass run=<run dir>"),
    (["run={run}", "step=7", "probes=[mqar_distance]"], "no checkpoint at step 7 in {run}/checkpoints; have steps [20]"),
    (["run={run}", "probes=[gd_match]"], "probe 'gd_match' does not apply to this run"),
    (["run={run}", "probes=[mqar_distance"], "probes=[mqar_distance: no viable alternative"),
    (["run={run}", "probes=[mqar_distance]", "+options.mqar_distance.x=1", "nothing=1"], "Could not override 'nothing'"),
]


@pytest.mark.parametrize("args, message", BAD_EVAL, ids=[" ".join(a) for a, _ in BAD_EVAL])
def test_a_bad_eval_request_is_one_line_and_writes_nothing(args, message, finished_run, tmp_path):
    import importlib

    from tmem.train.checkpoint import CheckpointError

    (tmp_path / "empty").mkdir()
    fill = lambda s: s.format(run=finished_run, tmp=tmp_path, empty=tmp_path / "empty")  # noqa: E731
    before = snapshot(tmp_path)
    with pytest.raises((ConfigError, CheckpointError)) as raised:
        importlib.import_module("eval").check_command([fill(a) for a in args])
    line = str(raised.value)
    assert fill(message) in line and "\n" not in line
    assert snapshot(tmp_path) == before


def test_a_resume_may_change_the_budget_cadence_and_logging(finished_run):
    # a budget raised with the decay's end kept where the run's was (train.steps, 20): a resume may not move it
    args = rundir.prepare([*TINY, f"hydra.run.dir={finished_run}", "train.resume=true", "train.steps=40",
                           "optim.decay_steps=20", "train.eval_every=5", "train.checkpoint_every=5",
                           "logger.mode=offline", "train.keep_checkpoints=null"])
    assert args[-2:] == [f"hydra.run.dir={finished_run}", "hydra.output_subdir=null"]  # .hydra stays as it started


def test_a_run_directory_is_claimed_once(tmp_path):
    run = tmp_path / "run"
    args = rundir.prepare([*TINY, f"hydra.run.dir={run}"])
    assert args[-1] == f"hydra.run.dir={run}" and json.loads((run / rundir.CLAIM).read_text())["pid"] == os.getpid()
    with pytest.raises(ConfigError, match="already holds a run"):  # a second command, even before any file is written
        rundir.prepare([*TINY, f"hydra.run.dir={run}"])
    with pytest.raises(ConfigError, match="is being trained by another process"):  # a resume while it trains
        rundir.lock(run)


def test_a_claim_whose_run_never_started_is_given_back_and_a_run_is_not(tmp_path, finished_run):
    run = tmp_path / "refused"
    rundir.prepare([*TINY, f"hydra.run.dir={run}"])
    (run / ".hydra").mkdir()
    for name in (".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml", "train.log"):
        (run / name).write_text("written by Hydra before the devices refused the batch")
    rundir.release(run)
    assert not run.exists()
    rundir.prepare([*TINY, f"hydra.run.dir={run}"])  # free again
    before = snapshot(finished_run)
    rundir.release(finished_run)  # it holds checkpoints and a summary
    assert snapshot(finished_run) == before


def test_two_commands_in_one_second_get_two_default_directories(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pinned = lambda: rundir.prepare([*TINY, "hydra.run.dir=outputs/same"])[-1]  # noqa: E731
    first = rundir.prepare(TINY)[-1]
    second = rundir.prepare(TINY)[-1]
    assert first != second and first.startswith("hydra.run.dir=outputs/")
    assert pinned() == "hydra.run.dir=outputs/same"
    with pytest.raises(ConfigError, match="already holds a run"):  # a directory the user names is never renamed
        pinned()


def test_a_sweep_gets_a_fresh_directory_and_its_jobs_never_share_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = rundir.prepare(["-m", *TINY, "model.width=16,32"])
    second = rundir.prepare(["-m", *TINY, "model.width=16,32"])
    assert first[-1] != second[-1] and first[-1].startswith("hydra.sweep.dir=multirun/")


def test_the_entry_point_refuses_before_hydra_writes(finished_run):
    before = snapshot(finished_run)
    done = run_entry("train.py", *TINY, f"hydra.run.dir={finished_run}", "train.resume=true", "model.width=32",
                     timeout=120)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("config error: train.resume: this command changes model.width")
    assert snapshot(finished_run) == before


def test_a_claim_is_exclusive_across_processes(tmp_path):
    """Two processes claim one directory at once: exactly one wins. Each stays alive (holding what it won) until
    both have tried: a winner that exited first would leave a claim a dead command abandoned, which the other may
    rightly take, as a slow start on a loaded machine once made it."""
    code = ("import sys; sys.path.insert(0, {root!r}); from tmem.train import rundir; from tmem.config import "
            "ConfigError\ntry:\n    rundir.claim(__import__('pathlib').Path({run!r})); print('won', flush=True)\n"
            "except ConfigError: print('lost', flush=True)\nsys.stdin.read()"
            ).format(root=str(ROOT), run=str(tmp_path / "run"))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    said = [p.stdout.readline().strip() for p in procs]  # both have tried; neither has exited
    for p in procs:
        p.communicate(timeout=120)
    assert sorted(said) == ["lost", "won"]


def resolved_of(*overrides) -> dict:
    """The resolved config of a TINY run with these overrides."""
    return OmegaConf.to_container(compose_config([*TINY, *overrides]), resolve=True)


def record(run_dir, resolved: dict) -> None:
    """Make run_dir hold only Hydra's record of a run's start, this config: what check_resume compares against."""
    (run_dir / ".hydra").mkdir()
    OmegaConf.save(OmegaConf.create(resolved), run_dir / ".hydra" / "config.yaml")


def changed(resolved: dict, group: str, **fields) -> dict:
    """The config with these fields of one group set."""
    return {**resolved, group: {**resolved[group], **fields}}


def test_a_resume_may_change_how_the_row_runs_but_not_the_memory(tmp_path):
    """The run part computes the same function in every form and chunk, so a delta row's run saved with
    eval_form null (before eval_form=auto) resumes under the new default and in another chunk; the memory's
    knobs still may not change."""
    resolved = resolved_of("mixer=deltanet")
    assert resolved["mixer"]["run"]["eval_form"] == "auto"
    record(tmp_path, changed(resolved, "mixer", run={**resolved["mixer"]["run"], "eval_form": None}))
    rundir.check_resume(tmp_path, resolved)
    rundir.check_resume(tmp_path, changed(resolved, "mixer", run={**resolved["mixer"]["run"], "chunk": 16}))
    with pytest.raises(ConfigError, match="mixer.short_conv"):
        rundir.check_resume(tmp_path, changed(resolved, "mixer", short_conv=2))


def test_the_mixer_fields_a_resume_may_change_are_those_its_row_marks(tmp_path):
    """Softmax's read implementation, in its run part, is resumable (tmem.mixers.base.run_field), its window is
    not."""
    resolved = resolved_of("mixer=softmax")
    record(tmp_path, resolved)
    rundir.check_resume(tmp_path, changed(resolved, "mixer", run={"implementation": "plain"}))
    with pytest.raises(ConfigError, match="changes mixer.window"):
        rundir.check_resume(tmp_path, changed(resolved, "mixer", window=4))


def test_a_resume_that_raises_the_budget_keeps_the_decays_end(tmp_path):
    """A decay that ends at train.steps (optim.decay_steps null) would end later if a resume raised the budget: the
    rate would jump up mid-run. Refused, naming the setting that keeps the run's schedule, which then resumes."""
    resolved = resolved_of()
    record(tmp_path, resolved)
    assert resolved["train"]["steps"] == 20 and resolved["optim"]["decay_steps"] is None
    kept = changed(resolved, "train", steps=40)
    with pytest.raises(ConfigError, match=r"from step 20 to 40 .* with optim.decay_steps=20, or start a new run"):
        rundir.check_resume(tmp_path, kept)
    rundir.check_resume(tmp_path, changed(kept, "optim", decay_steps=20))
    with pytest.raises(ConfigError, match="from step 20 to 30"):  # a decay's end set outright is the run's too
        rundir.check_resume(tmp_path, changed(kept, "optim", decay_steps=30))
    with pytest.raises(ConfigError, match="changes optim.schedule"):  # a changed schedule is named as itself
        rundir.check_resume(tmp_path, changed(kept, "optim", schedule="constant"))


def test_a_run_shorter_than_its_warmup_is_extended_by_the_setting_its_refusal_names(tmp_path):
    """Its decay ends one step after the warmup, not at train.steps (which decay_steps could not name: it must be
    more than the warmup): the suggested override validates, resumes, and keeps the run's own schedule."""
    from tmem.train.build import build

    resolved = resolved_of("optim.warmup_steps=50")
    record(tmp_path, resolved)
    with pytest.raises(ConfigError, match=r"from step 51 to 60 .* with optim.decay_steps=51,") as error:
        rundir.check_resume(tmp_path, changed(resolved, "train", steps=60))
    suggested = changed(changed(resolved, "train", steps=60), "optim", decay_steps=51)
    rundir.check_resume(tmp_path, suggested)
    rundir.check_resume(tmp_path, changed(resolved, "train", steps=40))  # still within the warmup: the same end
    assert "optim.decay_steps=51" in str(error.value)
    before, after = (build(validate(OmegaConf.create(c))).schedule for c in (resolved, suggested))
    steps = np.arange(0, 70, 3)
    np.testing.assert_array_equal([float(before(s)) for s in steps], [float(after(s)) for s in steps])


@pytest.mark.parametrize("overrides", [["optim.schedule=constant"], ["mixer=mamba2"]], ids=["constant", "recommended"])
def test_a_budget_raised_under_a_schedule_that_does_not_follow_it_resumes(tmp_path, overrides):
    """A constant rate, and a row's recommended decay (Mamba-2's ends at 1,500 whatever train.steps), do not move."""
    resolved = resolved_of(*overrides)
    record(tmp_path, resolved)
    rundir.check_resume(tmp_path, changed(resolved, "train", steps=40))


def test_a_run_saved_with_a_microbatch_number_resumes_with_auto(tmp_path):
    """Runs saved before train.microbatch=auto hold a number and no mixer.recipe.microbatch; the slice is no part
    of the run (the same update), so a resume may change it either way."""
    resolved = resolved_of()
    assert resolved["train"]["microbatch"] == "auto"
    recipe = {k: v for k, v in resolved["mixer"]["recipe"].items() if k != "microbatch"}
    record(tmp_path, {**changed(resolved, "train", microbatch=32), "mixer": {**resolved["mixer"], "recipe": recipe}})
    rundir.check_resume(tmp_path, resolved)
    rundir.check_resume(tmp_path, changed(resolved, "train", microbatch=8))
    with pytest.raises(ConfigError, match="train.batch_size"):
        rundir.check_resume(tmp_path, changed(resolved, "train", batch_size=8))


# A failure at each stage between the claim and the first checkpoint, injected into train.py's own code path: each
# command fails, its fresh directory is given back as it was, and the same command then trains there. One process
# runs them all (each a train.py run through runpy, as `python train.py` runs it): imports cost more than a stage.
INJECT = r'''
import json, runpy, sys
from pathlib import Path
sys.path.insert(0, {root!r})
import tmem.train.checkpoint as checkpoint, tmem.train.cluster as cluster, tmem.train.loop as loop
from tmem.train.cluster import RendezvousFailed

def fail(error):
    def raises(*args, **kwargs):
        raise error
    return raises

stages = {{
    "late config error": (loop, "check_divisible", lambda *a: "train.batch_size=16 is refused by the devices (injected)"),
    "cluster start": (cluster, "start", fail(RendezvousFailed("cluster.coordinator=localhost:1: injected"))),
    "build": (loop, "build", fail(RuntimeError("injected at build"))),
    "compile": (loop, "data_parallel_step", lambda *a: fail(OverflowError("injected at the step's compile"))),
    "first save": (checkpoint.Checkpoints, "save", fail(checkpoint.CheckpointError("injected at the first save"))),
}}
stages["the same command again"] = (loop, "run", loop.run)
run_dir, args, seen = Path({run!r}), {args!r}, {{}}
for stage, (owner, name, patch) in stages.items():
    kept = getattr(owner, name)
    setattr(owner, name, patch)
    sys.argv = ["train.py", *args]
    try:
        runpy.run_path({train!r}, run_name="__main__")
        seen[stage] = "trained"
    except SystemExit as e:
        seen[stage] = str(e.code)
    except Exception as e:
        seen[stage] = type(e).__name__
    finally:
        setattr(owner, name, kept)
    seen[stage] = [seen[stage], sorted(p.name for p in run_dir.iterdir()) if run_dir.exists() else None]
print(json.dumps(seen))
'''


@pytest.mark.slow  # about 60 s: five failed starts and one run
def test_a_run_that_fails_before_its_first_checkpoint_gives_its_directory_back(tmp_path):
    run = tmp_path / "run"
    args = [*TINY, "train.steps=4", "train.eval_every=2", "train.checkpoint_every=2", "logger=offline",
            f"hydra.run.dir={run}"]
    code = INJECT.format(root=str(ROOT), run=str(run), args=args, train=str(ROOT / "train.py"))
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {
        "late config error": ["config error: train.batch_size=16 is refused by the devices (injected)", None],
        "cluster start": ["error: cluster.coordinator=localhost:1: injected", None],
        "build": ["1", None],  # an error of the code, not the command: Hydra prints it, and the directory goes too
        "compile": ["1", None],
        "first save": ["error: injected at the first save", None],
        "the same command again": ["trained", [".hydra", rundir.CLAIM, "checkpoints", "metrics.jsonl", "resolved.yaml",
                                               "summary.json", "train.log", "wandb"]],
    }, done.stderr[-3000:]
    assert json.loads((run / "summary.json").read_text())["steps"] == 4


@pytest.mark.slow  # two subprocesses; the claim's exclusivity test stays quick
def test_a_claim_whose_command_died_is_taken_over_by_the_same_command(tmp_path):
    """Killed before its first checkpoint (SIGKILL, or an abort in C++ where Python cannot release it), a command
    leaves its claim unlocked and no run: the same command takes it over. A live claimant keeps it."""
    run = tmp_path / "run"
    code = ("import os, signal, sys; sys.path.insert(0, {root!r}); from pathlib import Path\n"
            "from tmem.train import rundir\n"
            "rundir.claim(Path({run!r})); (Path({run!r}) / '.hydra').mkdir(); "
            "(Path({run!r}) / '.hydra' / 'config.yaml').write_text('{{}}'); (Path({run!r}) / 'train.log').write_text('')\n"
            "print('claimed', flush=True); {end}")
    alive = subprocess.Popen([sys.executable, "-c", code.format(root=str(ROOT), run=str(run), end="input()")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert alive.stdout.readline().strip() == "claimed"
    with pytest.raises(ConfigError, match="already holds a run"):
        rundir.prepare([*TINY, f"hydra.run.dir={run}"])
    alive.communicate("\n", timeout=60)  # it ends normally: its claim is a finished command's, no longer locked
    shutil.rmtree(run)
    killed = subprocess.run([sys.executable, "-c", code.format(root=str(ROOT), run=str(run),
                                                               end="os.kill(os.getpid(), signal.SIGKILL)")],
                            capture_output=True, text=True, timeout=60)
    assert killed.returncode == -9 and (run / ".hydra" / "config.yaml").exists()
    rundir.prepare([*TINY, f"hydra.run.dir={run}"])
    assert sorted(p.name for p in run.iterdir()) == [rundir.CLAIM]
    assert json.loads((run / rundir.CLAIM).read_text())["pid"] == os.getpid()
    rundir.release(run)
    assert list(run.iterdir()) == []  # given back: the folder the dead command made stays, empty
