"""Gathering a sweep into Zoology's figure: each cell the median over seeds at its best rate, one panel per
setting, a CSV of the points."""

import csv
import json

import pytest
from omegaconf import OmegaConf

from conftest import compose_config
from tmem.sweeps import recall_curves


def fake_run(root, name, mixer, width, kv, lr, accuracy, seq_len=64, seed=0):
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    cfg = compose_config([f"model.width={width}", f"task.num_kv_pairs={kv}", f"task.seq_len={seq_len}"])
    cfg.mixer.name = mixer  # a mixer this branch may not have: the gather reads names, it builds nothing
    cfg.train.seed, cfg.optim.lr = seed, lr  # set here, not composed: one composition per cell shape
    OmegaConf.save(cfg, run / ".hydra" / "config.yaml")
    given = [f"mixer={mixer}", f"model.width={width}", f"task.num_kv_pairs={kv}", f"train.seed={seed}",
             *([] if lr is None else [f"optim.lr={lr}"])]
    OmegaConf.save(OmegaConf.create(given), run / ".hydra" / "overrides.yaml")
    trained_at = {"lr": lr if lr is not None else cfg.mixer.recipe.lr}  # as a run's summary has it: the row's rate
    (run / "summary.json").write_text(json.dumps({"eval/accuracy": accuracy, "eval/loss": 1.0 - accuracy,
                                                  "status": "completed", "steps": 10, "state_size": width**2,
                                                  "recipe": trained_at}))
    return run


def test_each_cell_is_the_median_of_its_seeds_at_the_rate_with_the_best_median(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    runs = [("softmax", 32, 4, 1e-3, [0.99, 0.97, 0.98]),
            ("softmax", 32, 4, 3e-3, [1.0, 0.5, 0.6]),  # the single best run, but the worse median: not drawn
            ("linear", 32, 4, 1e-3, [0.7, 0.9]), ("linear", 64, 16, 1e-3, [0.2]),
            ("softmax", 64, 16, None, [0.97])]  # optim.lr null: the mixer's recommended rate
    for mixer, width, kv, lr, accuracies in runs:
        for seed, acc in enumerate(accuracies):
            fake_run(sweep, f"{mixer}{width}-{lr}-{seed}", mixer, width, kv, lr, acc, seed=seed)
    (sweep / "unfinished" / ".hydra").mkdir(parents=True)  # no summary.json: skipped
    rows = recall_curves.gather([sweep])
    assert len(rows) == 10
    assert {r["lr"] for r in rows if r["accuracy"] == 0.97 and r["width"] == 64} == {1e-2}
    points = {(p["mixer"], p["width"], p["num_kv_pairs"]): p for p in recall_curves.cells(rows)}
    assert len(points) == 4
    softmax = points[("softmax", 32, 4)]
    assert (softmax["lr"], softmax["n"], softmax["seeds"]) == (1e-3, 3, "0,1,2")
    assert softmax["configuration"] == "mixer=softmax model.width=32 optim.lr=0.001 task.num_kv_pairs=4"
    assert (softmax["accuracy"], softmax["accuracy_min"], softmax["accuracy_max"]) == (0.98, 0.97, 0.99)
    linear = points[("linear", 32, 4)]
    assert (linear["accuracy"], linear["accuracy_min"], linear["accuracy_max"]) == (pytest.approx(0.8), 0.7, 0.9)
    fig = recall_curves.figure(list(points.values()))
    assert len(fig.axes) == 2  # one panel per (seq_len, kv) setting
    assert set(fig.axes[0].get_legend_handles_labels()[1]) == {"softmax", "linear"}

    out = tmp_path / "out"
    assert recall_curves.main([str(sweep), "--out", str(out)]) == 0
    with open(out / "recall_curves.csv") as f:
        table = {(r["mixer"], r["width"]): r for r in csv.DictReader(f)}
    assert len(table) == 4 and list(table[("softmax", "32")]) == recall_curves.COLUMNS
    assert [float(table[("softmax", "32")][c]) for c in ("accuracy", "accuracy_min", "accuracy_max")] == [
        0.98, 0.97, 0.99]  # the plotted numbers
    assert (out / "recall_curves.png").stat().st_size > 0 and (out / "recall_curves.svg").stat().st_size > 0
    assert recall_curves.main([str(sweep), "--out", str(out)]) == 2  # kept unless --force
    assert "add --force to overwrite" in capsys.readouterr().err


@pytest.mark.slow  # a trained run (7 s when this worker has none yet); the quick subset gathers written ones
def test_gather_reads_a_real_run_and_says_when_there_is_none(tiny_run, tmp_path, capsys):
    rows = recall_curves.gather([tiny_run])
    assert len(rows) == 1 and rows[0]["mixer"] == "softmax" and recall_curves.cells(rows)[0]["n"] == 1
    assert 0.0 <= rows[0]["accuracy"] <= 1.0 and rows[0]["state_size"] > 0
    assert recall_curves.main([str(tmp_path)]) == 1
    assert "no finished runs" in capsys.readouterr().err
    assert recall_curves.main([str(tmp_path / "missing")]) == 2


def test_sweep_config_names_every_row_and_composes():
    cfg = compose_config(["experiment=recall_curves"], config_name="train")
    assert cfg.task.name == "mqar" and cfg.mixer.name == "softmax"
    from hydra import compose, initialize_config_dir

    from conftest import ROOT

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        hydra_cfg = compose("train", overrides=["experiment=recall_curves"], return_hydra_config=True)
    params = hydra_cfg.hydra.sweeper.params
    assert set(params.mixer.split(",")) >= {"softmax", "linear", "deltanet", "gated_deltanet"}
    assert params["model.width"] and params["task.num_kv_pairs"]
