"""MAD's protocol: its settings against the anchor's table, its score on hand-made jobs, and one tiny real run.

The settings and the score are pure and quick; launching is checked with a
stand-in for the subprocess that writes finished jobs, so skipping and
continuing cost nothing; one real multirun of train.py (slow) checks the
whole path.
"""

import csv
import json
import math
from collections import Counter
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import compose_config, fake_job
from tasks import TASKS as TASK_SCHEMAS
from tmem.config import validate
from tmem.sweeps import mad, mad_score
from tmem.sweeps.mad_settings import FULL, REDUCED, TASKS, Plan, Setting, eval_every, settings, train_steps

# anchors/zoology-mad.md section 3: the baseline plus each change, per task
ANCHOR_COUNTS = {"in-context-recall": 1 + 3 + 3 + 4, "fuzzy-in-context-recall": 1 + 3 + 3 + 4,
                 "noisy-in-context-recall": 1 + 3 + 3 + 4 + 3, "selective-copying": 1 + 3 + 2 + 4 + 3,
                 "compression": 1 + 3 + 3 + 4, "memorization": 1 + 5}


def test_settings_match_mads_table_one_change_at_a_time():
    full = settings()
    assert Counter(s.task for s in full) == ANCHOR_COUNTS and len(full) == 66
    baselines = {t.label: t.baseline for t in TASKS}
    for s in full:
        changed = {k for k in s.fields if s.fields[k] != baselines[s.task][k]}
        assert len(changed) == (0 if s.label == "baseline" else 1), s
        if changed:
            (field,) = changed
            assert s.label == f"{field}-{s.fields[field]}"
        assert s.epochs == 200
        TASK_SCHEMAS[s.name](**s.fields)  # every setting is a valid tmem task
    assert len({(s.task, s.label) for s in full}) == 66  # one folder each
    noisy = [s.fields["vocab"] for s in full if s.task == "noisy-in-context-recall" and s.label.startswith("vocab")]
    assert noisy == [48, 80, 144]  # MAD's vocab counts the 16 noise tokens
    assert [s.fields["train_examples"] for s in full if s.label.startswith("train_examples")] == [6400, 3200,
                                                                                                 1600, 800] * 5


def test_reduced_is_each_baseline_short_with_the_whole_grid():
    reduced = settings(reduced=True)
    assert [s.task for s in reduced] == [t.label for t in TASKS] and {s.label for s in reduced} == {"baseline"}
    for s in reduced:
        TASK_SCHEMAS[s.name](**s.fields)
        assert s.fields["seq_len"] <= 64
        assert train_steps(s.fields["train_examples"], s.epochs, REDUCED.batch_size) == 160
        assert eval_every(s, REDUCED) == 160  # tested once, at the end
    assert (REDUCED.lrs, REDUCED.weight_decays) == ((1e-4, 5e-4, 1e-3), (0.0, 0.1))


def test_steps_are_mads_epochs_of_the_training_set():
    assert train_steps(12800, 200, 128) == 20000
    assert train_steps(800, 200, 128) == 1250  # 160,000 examples
    assert train_steps(256, 200, 128) == 400
    baseline = settings()[0]
    assert eval_every(baseline, FULL) == 100  # an epoch
    small = next(s for s in settings() if s.label == "train_examples-800")
    assert eval_every(small, FULL) == 50  # an epoch is 7 steps: no more often than 50


def test_job_overrides_compose_into_mads_recipe():
    s = settings(reduced=True)[0]
    args = mad.job_overrides(s, "softmax", REDUCED, ["model.width=64", "logger=offline"])
    assert args.count("logger=offline") == 1 and "logger=disabled" not in args  # the user's override wins
    cfg = validate(compose_config([*args, "optim.lr=1e-3", "optim.weight_decay=0.1"]))
    assert (cfg.task.seq_len, cfg.task.train_examples, cfg.train.steps, cfg.train.batch_size) == (32, 12800, 160, 32)
    assert (cfg.model.width, cfg.model.depth, cfg.mlp.name, cfg.optim.warmup_steps, cfg.optim.clip_norm) == (
        64, 2, "swiglu", 0, None)
    assert math.isclose(5e-4 * cfg.optim.final_lr_ratio, 1e-6) and cfg.train.target == 0.999
    assert (cfg.optim.lr, cfg.optim.weight_decay) == (1e-3, 0.1)


def test_launches_cover_exactly_the_missing_points():
    assert mad.launches(mad.missing_points(FULL, set())) == [([1e-4, 5e-4, 1e-3], [0.0, 0.1])]
    assert mad.missing_points(FULL, {(1e-4, 0.0), (5e-4, 0.0), (1e-3, 0.0), (1e-4, 0.1)}) == [(5e-4, 0.1),
                                                                                             (1e-3, 0.1)]
    assert mad.launches([(5e-4, 0.1), (1e-3, 0.1)]) == [([5e-4, 1e-3], [0.1])]
    assert mad.launches([(1e-4, 0.1), (5e-4, 0.0), (5e-4, 0.1)]) == [([1e-4], [0.1]), ([5e-4], [0.0, 0.1])]
    assert mad.launches([]) == []


def test_score_is_the_best_of_the_grid_then_means(tmp_path):
    jobs = {("in-context-recall", "baseline"): [0.2, 0.9, 0.5], ("in-context-recall", "vocab-32"): [0.4, None],
            ("memorization", "baseline"): [1.0, float("nan")]}
    for (task, setting), scores in jobs.items():
        for i, score in enumerate(scores):
            summary = {} if score is None else {"eval/macro_accuracy": score, "eval/accuracy": 0.5}
            fake_job(tmp_path / task / setting / "launch-0" / str(i), [f"optim.lr={i}e-4", "optim.weight_decay=0"],
                     **summary)
    assert mad.main(["--gather-only", str(tmp_path)]) == 0
    with open(tmp_path / "mad_scores.csv") as f:
        scores = {r["task"]: (int(r["settings"]), float(r["score"])) for r in csv.DictReader(f)}
    assert scores == {"in-context-recall": (2, pytest.approx(0.65)), "memorization": (1, 1.0),
                      "mean": (3, pytest.approx(0.825))}
    with open(tmp_path / "mad_settings.csv") as f:
        best = {(r["task"], r["setting"]): (r["lr"], r["jobs"]) for r in csv.DictReader(f)}
    assert best[("in-context-recall", "baseline")] == ("1e-4", "3")
    assert "| **mean over tasks** | 3 | **0.825** |" in (tmp_path / "mad_scores.md").read_text()

    rows = mad_score.read_jobs(tmp_path)  # the pure parts, on the same rows
    scores = mad_score.task_scores(mad_score.best_per_setting(rows))
    assert scores == {"in-context-recall": pytest.approx(0.65), "memorization": 1.0}
    assert mad_score.mean_score(scores) == pytest.approx(0.825)


def test_rerun_launches_only_what_is_missing(tmp_path):
    launched = []

    def run(command, **kwargs):  # a stand-in for train.py -m: every job of the multirun finishes at once
        args = dict(a.split("=", 1) for a in command[3:] if "=" in a)
        launched.append((args["optim.lr"], args["optim.weight_decay"]))
        for i, (lr, wd) in enumerate((lr, wd) for lr in args["optim.lr"].split(",")
                                     for wd in args["optim.weight_decay"].split(",")):
            fake_job(Path(args["hydra.sweep.dir"]) / str(i), [f"optim.lr={lr}", f"optim.weight_decay={wd}"],
                     **{"eval/macro_accuracy": float(lr) * 100 + float(wd)})

    argv = ["--mixer", "softmax", "--reduced", "--tasks", "compression", "--out", str(tmp_path)]
    assert mad.main(argv, run=run) == 0
    assert launched == [("0.0001,0.0005,0.001", "0,0.1")]
    assert mad.main(argv, run=run) == 0 and len(launched) == 1  # finished: nothing launched
    for job in (tmp_path / "compression" / "baseline" / "launch-0").iterdir():
        if OmegaConf.load(job / ".hydra" / "overrides.yaml") == ["optim.lr=0.001", "optim.weight_decay=0.1"]:
            (job / "summary.json").unlink()  # as if interrupted
    assert mad.main(argv, run=run) == 0
    assert launched[1:] == [("0.001", "0.1")]
    assert (tmp_path / "compression" / "baseline" / "launch-1").is_dir()
    assert "| compression | 1 of 1 | 0.200 |" in (tmp_path / "mad_scores.md").read_text()
    assert json.loads((tmp_path / "protocol.json").read_text())["seconds"] >= 0  # summed over the three commands
    assert mad.main(["--mixer", "deltanet", "--reduced", "--out", str(tmp_path)], run=run) == 2  # another mixer's


def test_every_argument_is_checked_before_any_job_is_launched(tmp_path, capsys):
    def run(command, **kwargs):
        raise AssertionError(f"launched {command}")

    base = ["--reduced", "--tasks", "compression", "--out", str(tmp_path / "out")]
    assert mad.main(["--mixer", "softmx", *base], run=run) == 2
    assert mad.main(["--mixer", "softmax", *base, "mixer.heads=7"], run=run) == 2  # 7 does not divide 128
    assert mad.main(["--mixer", "softmax", *base, "mlp=swiglu2"], run=run) == 2
    (tmp_path / "a_file").write_text("")
    assert mad.main(["--mixer", "softmax", "--reduced", "--out", str(tmp_path / "a_file")], run=run) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4 and err[0].startswith("error: --mixer softmx: no such mixer; known: deltanet, ")
    assert "softmax" in err[0] and err[1] == "error: mixer.heads=7 must divide model.width=128"
    assert err[2].startswith("error: mlp=swiglu2: no such option; allowed: ")
    assert err[3] == f"error: --out {tmp_path / 'a_file'} is a file; name a folder for the protocol's jobs and tables"
    assert not (tmp_path / "out").exists()


def test_gathering_skips_damaged_jobs_and_keeps_tables_it_did_not_make(tmp_path, capsys):
    for i, score in enumerate([0.3, 0.6]):
        fake_job(tmp_path / "compression" / "baseline" / "launch-0" / str(i),
                 [f"optim.lr={i + 1}e-4", "optim.weight_decay=0"], **{"eval/macro_accuracy": score})
    (tmp_path / "compression" / "baseline" / "launch-0" / "1" / "summary.json").write_text('{"eval/macro')
    (tmp_path / "mad_scores.md").write_text("a table of the user's\n")
    assert mad.main(["--gather-only", str(tmp_path)]) == 2
    assert (tmp_path / "mad_scores.md").read_text() == "a table of the user's\n"
    assert mad.main(["--gather-only", str(tmp_path), "--force"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"error: {tmp_path} already holds mad_scores.md; add --force to overwrite"
    assert err[1].startswith("skipped: ") and err[1].endswith("not JSON (Unterminated string starting at: line 1 "
                                                             "column 2 (char 1))")
    assert err[2] == "skipped 1 damaged job of 2"
    assert "| compression | 1 | 0.300 |" in (tmp_path / "mad_scores.md").read_text()


@pytest.mark.slow
def test_a_tiny_protocol_trains_and_scores(tmp_path):
    """One setting, one grid point, a few steps of a width-16 model: train.py's real multirun, then the table."""
    tiny = Setting("compression", "mad_compression", "baseline", {"vocab": 8, "seq_len": 8, "train_examples": 64}, 1.0)
    plan = Plan(batch_size=16, lrs=(1e-3,), weight_decays=(0.0,), eval_epochs=None)
    extra = ["model.width=16", "mixer.heads=2", "task.heldout_size=32", "train.microbatch=null"]
    assert mad.run_setting(tiny, "softmax", plan, tmp_path, extra)
    (job,) = [p for p in (tmp_path / "compression" / "baseline" / "launch-0").iterdir() if p.is_dir()]
    summary = json.loads((job / "summary.json").read_text())
    assert summary["steps"] == 4 and 0 <= summary["eval/macro_accuracy"] <= 1
    assert mad.score(tmp_path, None) == 0
    assert f"| compression | 1 | {summary['eval/macro_accuracy']:.3f} |" in (tmp_path / "mad_scores.md").read_text()
