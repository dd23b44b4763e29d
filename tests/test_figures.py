"""The figure commands on a hand-made sweep of known numbers: each writes PNG, SVG and the CSV of what it drew,
and the drawn lines hold those numbers."""

import csv

import numpy as np
import pytest

from conftest import softmax_and_linear
from tmem.sweeps import figures
from tmem.sweeps.gather import jobs


@pytest.fixture
def sweep(tmp_path):
    softmax_and_linear(tmp_path / "sweep")
    return tmp_path / "sweep"


def drawn(folder, name):
    assert (folder / f"{name}.png").stat().st_size > 0 and (folder / f"{name}.svg").stat().st_size > 0
    with open(folder / f"{name}.csv") as f:
        return list(csv.DictReader(f))


def test_learning_curves_are_the_median_and_band_over_seeds_at_shared_steps(sweep, tmp_path, capsys):
    assert figures.main(["curves", str(sweep), "--out", str(tmp_path / "out")]) == 0
    table = drawn(tmp_path / "out", "learning_curves")
    assert [(r["configuration"], r["step"], r["n"]) for r in table] == [
        ("mixer=softmax", "50", "3"), ("mixer=softmax", "100", "3"),
        ("mixer=linear", "50", "3"), ("mixer=linear", "100", "3"), ("mixer=linear", "150", "3")]
    np.testing.assert_allclose([[float(r[k]) for k in ("median", "min", "max")] for r in table],
                               [[0.6, 0.5, 0.7], [0.995, 0.99, 0.999], [0.4, 0.2, 0.6], [0.8, 0.6, 0.991],
                                [0.8, 0.6, 0.991]])
    fig = figures.learning_curves(jobs([sweep])).figure
    lines = {line.get_label(): line for line in fig.axes[0].lines}
    np.testing.assert_allclose(lines["mixer=linear (n=3)"].get_ydata(), [0.4, 0.8, 0.8])

    (sweep / "5" / "metrics.jsonl").write_text('{"step": 50, "eval/accuracy": 0.6}\n{"step": 100, "eval/acc\n'
                                               '{"step": 150, "eval/accuracy": 0.8}\n')  # a line cut inside
    (sweep / "4" / "metrics.jsonl").unlink()  # a run from before the file was written
    with open(sweep / "3" / "metrics.jsonl", "a") as f:
        f.write('{"step": 200, "eval/acc')  # the last line cut by a kill: the run's curve up to it stands
    rows = figures.learning_curves(jobs([sweep])).rows
    assert [(r["configuration"], r["n"], r["median"]) for r in rows if r["step"] == 100] == [
        ("mixer=softmax", 3, 0.995), ("mixer=linear", 1, 0.991)]  # the rest drawn
    err = capsys.readouterr().err.splitlines()
    assert err == [f"skipped: {sweep / '5' / 'metrics.jsonl'}: line 2 is not JSON: '{{\"step\": 100, \"eval/acc'",
                   "skipped 1 damaged job of 6",
                   "1 of 6 jobs have no metrics.jsonl (runs made before it was written): no curve"]


def test_steps_to_target_draws_every_seed_and_the_median_unreached_at_the_budget(sweep, tmp_path):
    assert figures.main(["steps", str(sweep), "--out", str(tmp_path / "out")]) == 0
    table = [(r["configuration"], r["mark"], r["seed"], r["steps"], r["reached"])
             for r in drawn(tmp_path / "out", "steps_to_target")]
    assert sorted(table) == sorted([
        ("mixer=softmax", "seed", "0", "100", "True"), ("mixer=softmax", "seed", "1", "300", "True"),
        ("mixer=softmax", "seed", "2", "200", "True"), ("mixer=linear", "seed", "0", "400", "True"),
        ("mixer=linear", "seed", "1", "500", "False"), ("mixer=linear", "seed", "2", "500", "False"),
        ("mixer=softmax", "median", "", "200", "True"), ("mixer=linear", "median", "", ">=500", "False")])
    ax = figures.steps_to_target(jobs([sweep])).figure.axes[0]
    unreached = [line for line in ax.lines if line.get_marker() == "^"]
    assert [float(line.get_ydata()[0]) for line in unreached] == [500, 500]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["mixer=softmax", "mixer=linear"]


def test_state_size_against_accuracy_and_the_commands_checks(sweep, tmp_path, capsys):
    out = tmp_path / "out"
    assert figures.main(["state", str(sweep), "--out", str(out)]) == 0
    table = {r["configuration"]: (int(r["state_size"]), int(r["n"]), float(r["median"]), float(r["min"]),
                                  float(r["max"])) for r in drawn(out, "state_size")}
    assert table == {"mixer=softmax": (64, 3, 0.995, 0.99, 0.999), "mixer=linear": (32, 3, 0.8, 0.6, 0.991)}

    assert figures.main(["state", str(sweep), "--out", str(out)]) == 2  # exists: kept
    assert figures.main(["state", str(sweep), "--out", str(out / "state_size.csv")]) == 2  # a file, not a folder
    assert figures.main(["curve", str(sweep)]) == 2
    assert figures.main(["curves", str(tmp_path / "none")]) == 2
    (tmp_path / "empty").mkdir()
    assert figures.main(["curves", str(tmp_path / "empty")]) == 1
    err = capsys.readouterr().err.splitlines()
    files = "state_size.csv, state_size.png, state_size.svg"
    assert err[0] == f"error: {out} already holds {files}; add --force to overwrite"
    assert err[1] == f"error: --out {out / 'state_size.csv'} is a file; name a folder for {files}"
    assert err[2] == ("error: 'curve' is not a figure; name one of: curves, steps, state, report "
                      "(python -m tmem.sweeps.figures curves DIR)")
    assert err[3] == f"error: no such directory: {tmp_path / 'none'}" and err[4].startswith("error: no finished runs")
    assert figures.main(["state", str(sweep), "--out", str(out), "--force"]) == 0


@pytest.mark.slow  # draws and writes a figure: 3 to 9 s on the loaded 2-core machine
def test_a_probes_curve_from_the_eval_reports_over_seeds(sweep, tmp_path, capsys):
    import json

    for job, (a, b) in enumerate([(0.1, 0.5), (0.3, 0.7), (0.2, 0.6), (0.0, 1.0), (0.0, 1.0), (0.0, 1.0)]):
        (sweep / str(job) / "eval").mkdir()
        (sweep / str(job) / "eval" / "report.json").write_text(json.dumps(
            {"step": 100, "rephrasing": {"recall": {"0": 1.0, "0.5": a + b, "1.5": a}, "r50": b}}))
    assert figures.main(["report", str(sweep), "--out", str(tmp_path / "out"),
                         "--metric", "rephrasing.recall.*"]) == 0
    table = drawn(tmp_path / "out", "report_curves")
    assert [(r["configuration"], r["step"], r["median"], r["min"], r["max"]) for r in table[:3]] == [
        ("mixer=softmax", "0.0", "1.0", "1.0", "1.0"), ("mixer=softmax", "0.5", "0.8", "0.6", "1.0"),
        ("mixer=softmax", "1.5", "0.2", "0.1", "0.3")]  # the radius keys, dots and all, read as numbers
    assert figures.main(["report", str(sweep), "--out", str(tmp_path / "out2")]) == 2
    assert "report needs --metric" in capsys.readouterr().err
