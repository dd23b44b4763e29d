"""A multirun's jobs share one wandb group, and any multirun gathers into one CSV with the best job per group.

The pure parts are quick; one real multirun (slow: two jobs with offline
wandb, ~20 s on 2 cores) checks them end to end.
"""

import csv
import os

import pytest
from omegaconf import OmegaConf

from conftest import TINY, entry_devices, fake_job, run_entry, wandb_run
from tmem.sweeps import gather
from tmem.train.tracking import group_and_config, sweep_job


def mqar(accuracy):
    return {"eval/accuracy": accuracy, "target_metric": "eval/accuracy", "higher_is_better": True}


def test_gather_writes_every_job_and_marks_the_best_of_each_group(tmp_path, capsys):
    recall, regression = tmp_path / "recall", tmp_path / "regression"
    for i, (mixer, lr, acc) in enumerate([("softmax", "1e-3", 0.9), ("softmax", "3e-3", 0.99),
                                          ("linear", "1e-3", 0.7), ("linear", "3e-3", 0.6)]):
        fake_job(recall / str(i), [f"mixer={mixer}", f"optim.lr={lr}"], **mqar(acc))
    fake_job(recall / "4", ["mixer=linear", "optim.lr=1e-2"], status="diverged", target_metric="eval/accuracy")
    # a loss target: lower is better, from the summary's own word, and by name for a summary without it
    fake_job(regression / "0", ["optim.lr=1e-3"], **{"eval/loss": 0.5, "target_metric": "eval/loss",
                                                    "higher_is_better": False})
    fake_job(regression / "1", ["optim.lr=3e-3"], **{"eval/loss": 0.2, "target_metric": "eval/loss"})
    (recall / "5" / ".hydra").mkdir(parents=True)  # unfinished: no summary.json, no row

    out = tmp_path / "out" / "jobs.csv"
    assert gather.main([str(recall), str(regression), "--by", "mixer", "--out", str(out)]) == 0
    with open(out) as f:
        table = list(csv.DictReader(f))
    assert len(table) == 7
    assert list(table[0])[:5] == ["sweep", "job", "best", "mixer", "optim.lr"]  # overrides before the summary
    best = {(r["sweep"].split("/")[-1], r["mixer"]): (r["job"], r["optim.lr"]) for r in table if r["best"] == "True"}
    assert best == {("recall", "softmax"): ("1", "3e-3"), ("recall", "linear"): ("2", "1e-3"),
                    ("regression", ""): ("1", "3e-3")}
    printed = capsys.readouterr().out
    assert "7 jobs in 2 sweeps; the best job of each of 3 groups:" in printed
    assert f"{recall} mixer=softmax: job 1, eval/accuracy=0.99 (optim.lr=3e-3)" in printed
    assert f"{regression}: job 1, eval/loss=0.2 (optim.lr=3e-3)" in printed

    # one group per sweep without --by; another metric on request
    found = gather.gather([recall], metric="steps")
    assert len(found.best) == 1 and found.swept[str(recall)] == ["mixer", "optim.lr"]
    assert [r["job"] for r in gather.gather([recall]).rows if r["best"]] == ["1"]


def test_gather_names_what_is_missing(tmp_path, capsys):
    assert gather.main([str(tmp_path / "nowhere")]) == 2
    assert gather.main([str(tmp_path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"error: no such directory: {tmp_path / 'nowhere'}"
    assert err[1].startswith("error: no finished runs")


def hydra_job(mode, sweep_dir="multirun/2026-01-02/10-11-12", num=3):
    """The fields of Hydra's own config a job reads (HydraConfig.get() in train.py)."""
    return OmegaConf.create({"mode": mode, "sweep": {"dir": sweep_dir}, "job": {"num": num, "override_dirname":
                             "optim.lr=0.01,train.seed=1"}, "overrides": {"task": ["optim.lr=0.01", "train.seed=1"]}})


def test_a_sweeps_jobs_share_one_group_and_carry_their_overrides():
    from hydra.types import RunMode

    assert sweep_job(hydra_job(RunMode.RUN)) is None
    job = sweep_job(hydra_job(RunMode.MULTIRUN))
    assert job["group"] == "2026-01-02/10-11-12" and job["job"] == 3  # the date too: a time repeats daily
    assert job["overrides"] == ["optim.lr=0.01", "train.seed=1"] and job["sweep_dir"].endswith("10-11-12")
    resolved = {"train": {"seed": 1}}
    assert group_and_config("my-run", resolved, None) == ("my-run", resolved)  # a single run: as before
    group, config = group_and_config("3", resolved, job)
    assert group == "2026-01-02/10-11-12" and config["train"] == {"seed": 1}
    assert config["multirun"]["overrides"] == job["overrides"] and "group" not in config["multirun"]
    assert resolved == {"train": {"seed": 1}}  # the run's own config (what checkpoints keep) is left alone


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A real multirun of two tiny jobs (two seeds, so the second compiles nothing new), tracked offline."""
    sweep = tmp_path_factory.mktemp("multirun") / "lr_scan"
    done = run_entry("train.py", "-m", *TINY, "train.steps=2", "train.seed=0,1", "logger=offline",
                     f"hydra.sweep.dir={sweep}", env={**os.environ, "WANDB_MODE": "offline"})
    assert done.returncode == 0, done.stderr[-3000:]
    return sweep


@pytest.mark.slow
def test_a_multiruns_jobs_log_to_one_wandb_group_with_their_overrides(sweep):
    runs = [wandb_run(sweep / str(job)) for job in (0, 1)]
    assert {r["group"] for r in runs} == {f"{sweep.parent.name}/lr_scan"}
    for job, r in enumerate(runs):
        swept = r["config"]["multirun"]
        assert swept["job"] == job and swept["sweep_dir"] == str(sweep)
        assert f"train.seed={job}" in swept["overrides"] and f"train.seed={job}" in swept["override_dirname"]
        assert r["config"]["train"]["seed"] == job  # the resolved config, as a single run logs it
    # the config a checkpoint keeps is the run's own, so a resume of a job compares like with like
    assert "multirun" not in OmegaConf.load(sweep / "0" / ".hydra" / "config.yaml")


@pytest.mark.slow
def test_gather_reads_a_real_multirun(sweep, capsys):
    assert gather.main([str(sweep)]) == 0
    with open(sweep / "jobs.csv") as f:
        table = list(csv.DictReader(f))
    assert [r["train.seed"] for r in table] == ["0", "1"]
    assert {r["devices"] for r in table} == {str(entry_devices(*TINY))} and sum(r["best"] == "True" for r in table) == 1
    assert f"{sweep}: job " in capsys.readouterr().out
