"""Seeds as an axis: order statistics of censored runs, jobs folded into configurations, curves into bands, and
the gather and table commands over a hand-made sweep whose numbers are known."""

import csv
import json

import pytest

from conftest import TARGET, fake_job, softmax_and_linear
from tmem.sweeps import gather, runs, table
from tmem.sweeps.seeds import AtLeast, band, interval_rank, order_statistics



def test_the_medians_interval_is_the_sign_tests_from_six_seeds():
    # the classical table of distribution-free 95% intervals of the median: (n, rank j of [x_(j), x_(n+1-j)])
    assert [interval_rank(n) for n in range(1, 6)] == [None] * 5  # 93.75% at n = 5: no interval
    assert [(n, interval_rank(n)) for n in (6, 8, 9, 10, 12, 20)] == [(6, 1), (8, 1), (9, 2), (10, 2), (12, 3),
                                                                     (20, 6)]
    stats = order_statistics(list(range(9, 0, -1)), [False] * 9)
    assert stats == {"median": 5, "min": 1, "max": 9, "ci_lo": 2, "ci_hi": 8}
    assert order_statistics([1.0, 2.0, 4.0, 10.0], [False] * 4)["median"] == 3.0  # even n: the middle two's mean
    assert order_statistics([], [])["median"] is None


def test_a_censored_value_makes_the_statistics_it_reaches_lower_bounds():
    # two seeds that never reached the target within 500 steps: the median is at least 500
    s = order_statistics([400, 500, 500], [False, True, True])
    assert s["median"] == 500 and isinstance(s["median"], AtLeast) and str(s["median"]) == ">=500"
    assert s["min"] == 400 and not isinstance(s["min"], AtLeast) and isinstance(s["max"], AtLeast)
    # one censored seed at the budget, above the median: the median stands, the max is a bound
    s = order_statistics([100, 200, 500], [False, False, True])
    assert type(s["median"]) is int and s["median"] == 200 and isinstance(s["max"], AtLeast)
    # a censored value below the median could lie above it: the median is then only a bound
    s = order_statistics([50, 200, 300], [True, False, False])
    assert all(isinstance(s[k], AtLeast) for k in ("median", "min", "max"))  # it could lie above them all
    # a run that reached the target exactly at the budget is exact, a censored one beside it changes nothing
    assert type(order_statistics([100, 500, 500], [False, False, True])["median"]) is int


def test_curves_keep_the_last_of_a_repeated_step_and_band_over_shared_steps():
    lines = [{"step": 10, "eval/accuracy": 0.1}, {"step": 20, "train/loss": 2.0},
             {"step": 20, "eval/accuracy": 0.3}, {"step": 20, "eval/accuracy": 0.5},  # resumed: the last counts
             {"step": 30, "eval/accuracy": float("nan")}]
    assert runs.curve(lines, "eval/accuracy") == {10: 0.1, 20: 0.5}
    assert band([{10: 0.1, 20: 0.5}, {10: 0.3, 20: 0.7, 30: 0.9}, {10: 0.2, 20: 0.9}, {}]) == [
        {"step": 10, "n": 3, "median": 0.2, "min": 0.1, "max": 0.3},
        {"step": 20, "n": 3, "median": 0.7, "min": 0.5, "max": 0.9}]


def test_gather_folds_seeds_into_median_min_max_with_unreached_runs_as_at_least_the_budget(tmp_path, capsys):
    softmax_and_linear(tmp_path / "sweep")
    folded = gather.fold_seeds(gather.jobs([tmp_path]))
    rows = {r["mixer"]: r for r in folded.rows}
    assert folded.keys == ["mixer"] and set(rows) == {"softmax", "linear"}
    s, lin = rows["softmax"], rows["linear"]
    assert (s["n"], s["n_reached"], s["seeds"], s["status"]) == (3, 3, "0,1,2", "completed 3")
    assert (s["target_step:median"], s["target_step:min"], s["target_step:max"]) == (200, 100, 300)
    assert (s["target_seconds:median"], s["eval/accuracy:median"], s["recipe.lr:median"]) == (2.0, 0.995, 0.003)
    assert s["target_step:ci_lo"] is None  # three seeds: no interval
    assert (lin["n"], lin["n_reached"], lin["status"]) == (3, 1, "completed 1, budget 2")
    assert lin["target_step:min"] == 400 and str(lin["target_step:median"]) == ">=500"  # the budget, a bound
    assert str(lin["target_seconds:median"]) == ">=6" and str(lin["target_seconds:max"]) == ">=7"
    assert "train.seed" not in folded.columns and "target_step:ci_lo" not in folded.columns

    out = tmp_path / "seeds.csv"
    assert gather.main([str(tmp_path / "sweep"), "--seeds", "--out", str(out)]) == 0
    with open(out) as f:
        table_rows = {r["mixer"]: r for r in csv.DictReader(f)}
    assert table_rows["linear"]["target_step:median"] == ">=500" and table_rows["linear"]["n_reached"] == "1"
    assert table_rows["softmax"]["target_step:median"] == "200" and table_rows["softmax"]["n"] == "3"
    printed = capsys.readouterr().out
    assert "folded over train.seed into 2 configurations" in printed
    assert "mixer=linear   3  1/3      >=500 [400->=500]" in printed
    assert "mixer=softmax  3  3/3      200 [100-300]" in printed


def test_six_seeds_give_the_medians_interval(tmp_path):
    for seed in range(6):
        fake_job(tmp_path / str(seed), [f"train.seed={seed}"], **TARGET, target_step=100 * (seed + 1),
                 target_seconds=1.0)
    folded = gather.fold_seeds(gather.jobs([tmp_path]))
    (row,) = folded.rows
    assert (row["target_step:ci_lo"], row["target_step:ci_hi"], row["target_step:median"]) == (100, 600, 350)
    assert "target_step:ci_lo" in folded.columns and folded.keys == []


def test_damaged_jobs_are_named_counted_and_skipped(tmp_path, capsys):
    softmax_and_linear(tmp_path)
    (tmp_path / "1" / "summary.json").write_text('{"status": "compl')  # cut short
    (tmp_path / "5" / "summary.json").write_text("[1, 2]")  # JSON, not a summary
    (tmp_path / "3" / ".hydra" / "overrides.yaml").write_text("- mixer=linear\n- [unclosed\n")
    found = gather.jobs([tmp_path])
    assert sorted(j.overrides["train.seed"] for j in found) == ["0", "1", "2"]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4 and err[-1] == "skipped 3 damaged jobs of 6"
    assert err[0].startswith(f"skipped: {tmp_path / '1' / 'summary.json'}: not JSON")
    assert err[1].startswith(f"skipped: {tmp_path / '3' / '.hydra' / 'overrides.yaml'}: not YAML")
    assert err[2] == f"skipped: {tmp_path / '5' / 'summary.json'}: not a JSON object"
    assert gather.main([str(tmp_path)]) == 0  # the command gathers the rest
    assert "3 jobs in 1 sweeps" in capsys.readouterr().out

    (tmp_path / "0" / "metrics.jsonl").write_text('{"step": 50, "eval/accuracy": 0.5}\n{"step": 10')
    assert runs.metrics(tmp_path / "0") == [{"step": 50, "eval/accuracy": 0.5}]  # the last line cut by a kill
    (tmp_path / "0" / "metrics.jsonl").write_text('{"step": 10\n{"step": 50, "eval/accuracy": 0.5}\n')
    with pytest.raises(runs.Damaged, match="metrics.jsonl: line 1 is not JSON"):
        runs.metrics(tmp_path / "0")


def test_outputs_are_checked_before_anything_is_written(tmp_path, capsys):
    softmax_and_linear(tmp_path / "sweep")
    folder = tmp_path / "a_folder"
    folder.mkdir()
    assert gather.main([str(tmp_path / "sweep"), "--out", str(folder)]) == 2
    under_a_file = tmp_path / "sweep" / "0" / "summary.json" / "x.csv"
    assert gather.main([str(tmp_path / "sweep"), "--out", str(under_a_file)]) == 2
    assert gather.main([str(tmp_path / "sweep")]) == 0
    assert gather.main([str(tmp_path / "sweep")]) == 2  # jobs.csv exists
    err = capsys.readouterr().err.splitlines()
    assert err == [f"error: --out {folder} is a folder; name the file to write (e.g. {folder / 'jobs.csv'})",
                   f"error: {tmp_path / 'sweep' / '0' / 'summary.json'} is a file, so nothing can be written under it",
                   f"error: {tmp_path / 'sweep' / 'jobs.csv'} exists; add --force to overwrite it"]
    assert gather.main([str(tmp_path / "sweep"), "--force"]) == 0


def test_the_table_names_its_sweep_command_and_times_rows_against_softmax(tmp_path, capsys):
    sweep = tmp_path / "rows"
    softmax_and_linear(sweep)
    (sweep / "multirun.yaml").write_text("hydra: {overrides: {task: ['mixer=softmax,linear', 'train.seed=0,1,2']}}\n")
    for job in sweep.glob("*/summary.json"):
        job.write_text(json.dumps({**json.loads(job.read_text()), "versions": {"commit": "abc1234"}}))
    out = tmp_path / "rows.md"
    assert table.main([str(sweep), "--out", str(out)]) == 0
    text = out.read_text()
    assert text == capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0] == f"Sweep: `python train.py -m mixer=softmax,linear train.seed=0,1,2 hydra.sweep.dir={sweep}`"
    assert lines[1] == f"Table: `python -m tmem.sweeps.table {sweep} --out {out}`"
    assert lines[2].startswith("Commit: abc1234; last run finished 20")
    assert lines[4] == ("| mixer | n | reached | steps to 0.99 | seconds to 0.99 | x softmax | parameters "
                        "| state size |")
    rows = {line.split(" | ")[0]: line for line in lines[6:]}
    assert rows["| softmax"] == "| softmax | 3 | 3/3 | 200 [100-300] | 2.0 [1.0-3.0] | 1.00 | 1000 | 64 |"
    assert rows["| linear"] == "| linear | 3 | 1/3 | >=500 [400->=500] | >=6.0 [4.0->=7.0] | >=3.00 | 900 | 32 |"
    assert table.main([str(sweep), "--out", str(out)]) == 2 and "--force" in capsys.readouterr().err
    assert table.main([str(sweep), "--base", "softmax"]) == 2


@pytest.mark.slow  # six tiny jobs through train.py -m (about a minute on the two shared cores)
def test_a_real_three_seed_sweep_of_two_rows_folds_to_its_jobs_numbers(tmp_path, capsys):
    import statistics

    from conftest import TINY, run_entry

    sweep = tmp_path / "rows"
    done = run_entry("train.py", "-m", *TINY, "train.steps=10", "train.eval_every=5", "train.target=0.1",
                     "mixer=softmax,linear", "train.seed=0,1,2", f"hydra.sweep.dir={sweep}")
    assert done.returncode == 0, done.stderr[-3000:]
    summaries = [json.loads((sweep / str(i) / "summary.json").read_text()) for i in range(6)]
    folded = gather.fold_seeds(gather.jobs([sweep]))
    assert [(r["mixer"], r["n"], r["seeds"]) for r in folded.rows] == [("softmax", 3, "0,1,2"), ("linear", 3, "0,1,2")]
    for row, jobs in zip(folded.rows, (summaries[:3], summaries[3:])):
        accuracy = [s["eval/accuracy"] for s in jobs]
        assert row["eval/accuracy:median"] == statistics.median(accuracy)
        assert (row["eval/accuracy:min"], row["eval/accuracy:max"]) == (min(accuracy), max(accuracy))
        steps = [s["target_step"] for s in jobs]
        assert row["n_reached"] == sum(s is not None for s in steps)
        assert row["target_step:max"] == (max(steps) if None not in steps else AtLeast(10))
    assert table.main([str(sweep)]) == 0
    assert "| mixer | n | reached | steps to 0.1 |" in capsys.readouterr().out


def test_a_probes_report_folds_over_seeds_beside_the_training_summary(tmp_path, capsys):
    for seed, cos in enumerate([0.2, 0.1, 0.3]):
        job = fake_job(tmp_path / str(seed), ["mixer=softmax", f"train.seed={seed}"], **TARGET)
        (job / "eval").mkdir()
        (job / "eval" / "report.json").write_text(json.dumps({
            "run": str(job), "step": 600, "task_overrides": {}, "task": {"name": "repeat"}, "figures": {},
            "keys_move": {"final": {"layer0": {"cos": cos}}, "steps": {"50": {"layer0": {"cos": cos / 2}}},
                          "per_head": [cos]}}))
    fake_job(tmp_path / "3", ["mixer=linear", "train.seed=0"], **TARGET)  # never evaluated: no report fields
    rows = {r["mixer"]: r for r in gather.fold_seeds(gather.jobs([tmp_path])).rows}
    s = rows["softmax"]
    assert (s["report.keys_move.final.layer0.cos:median"], s["report.keys_move.final.layer0.cos:min"],
            s["report.keys_move.final.layer0.cos:max"]) == (0.2, 0.1, 0.3)
    assert s["report.keys_move.steps.50.layer0.cos:median"] == 0.1 and s["report.step:median"] == 600
    assert not any(k.startswith(("report.run", "report.task", "report.figures", "report.keys_move.per_head"))
                   for k in s)
    assert rows["linear"].get("report.step:median") is None
    (tmp_path / "1" / "eval" / "report.json").write_text('{"step": 6')  # cut short: that job is named and skipped
    assert len(gather.jobs([tmp_path])) == 3
    assert "1/eval/report.json: not JSON" in capsys.readouterr().err


def test_gather_folds_each_jobs_probe_report_with_eval(tmp_path, capsys):
    for seed, distance in enumerate([0.2, 0.4, 0.3]):
        job = fake_job(tmp_path / "rows" / str(seed), ["mixer=deltanet", f"train.seed={seed}"], **TARGET)
        (job / "eval").mkdir()
        (job / "eval" / "report.json").write_text(json.dumps(
            {"step": 10, "least_squares": {"recall": {"state": 0.9 + seed / 100}, "layers": {"0": {"mean_distance": {
                "hebbian": distance}}}, "ridges": [0.1]}}))
    fake_job(tmp_path / "rows" / "3", ["mixer=linear", "train.seed=0"], **TARGET)  # never probed: no report fields
    assert gather.main([str(tmp_path / "rows"), "--seeds", "--eval", "eval"]) == 0
    rows = {r["mixer"]: r for r in csv.DictReader(open(tmp_path / "rows" / "seeds.csv"))}
    assert rows["deltanet"]["n"] == "3" and rows["linear"]["report.least_squares.recall.state:median"] == ""
    assert float(rows["deltanet"]["report.least_squares.layers.0.mean_distance.hebbian:median"]) == pytest.approx(0.3)
    assert float(rows["deltanet"]["report.least_squares.recall.state:max"]) == pytest.approx(0.92)
