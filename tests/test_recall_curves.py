"""Gathering a sweep into Zoology's figure: best run per cell, one panel per setting, a CSV."""

import csv
import json

import pytest
from omegaconf import OmegaConf

from conftest import compose_config
from tmem.sweeps import recall_curves


def fake_run(root, name, mixer, width, kv, lr, accuracy, seq_len=64):
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    cfg = compose_config([f"model.width={width}", f"task.num_kv_pairs={kv}", f"task.seq_len={seq_len}",
                          *([] if lr is None else [f"optim.lr={lr}"])])
    cfg.mixer.name = mixer  # a mixer this branch may not have: the gather reads names, it builds nothing
    OmegaConf.save(cfg, run / ".hydra" / "config.yaml")
    (run / "summary.json").write_text(json.dumps({"eval/accuracy": accuracy, "eval/loss": 1.0 - accuracy,
                                                  "status": "completed", "steps": 10, "state_size": width**2}))
    return run


def test_gather_keeps_each_cells_best_run_and_writes_figure_and_csv(tmp_path):
    sweep = tmp_path / "sweep"
    for i, (mixer, width, kv, lr, acc) in enumerate([
        ("softmax", 32, 4, 1e-3, 0.99), ("softmax", 32, 4, 3e-3, 1.0), ("softmax", 64, 16, 1e-3, 0.98),
        ("linear", 32, 4, 1e-3, 0.7), ("linear", 32, 4, 3e-3, 0.8), ("linear", 64, 16, 1e-3, 0.2),
        ("softmax", 64, 16, None, 0.97),  # optim.lr null: the mixer's recommended rate
    ]):
        fake_run(sweep, str(i), mixer, width, kv, lr, acc)
    (sweep / "unfinished" / ".hydra").mkdir(parents=True)  # no summary.json: skipped
    rows = recall_curves.gather([sweep])
    assert len(rows) == 7
    assert {r["lr"] for r in rows if r["accuracy"] == 0.97} == {1e-2}
    best = {(r["mixer"], r["width"], r["num_kv_pairs"]): r for r in rows if r["best"]}
    assert best[("softmax", 32, 4)]["lr"] == 3e-3 and best[("linear", 32, 4)]["accuracy"] == 0.8
    assert len(best) == 4
    fig = recall_curves.figure(rows)
    assert len(fig.axes) == 2  # one panel per (seq_len, kv) setting
    assert set(fig.axes[0].get_legend_handles_labels()[1]) == {"softmax", "linear"}

    assert recall_curves.main([str(sweep), "--out", str(tmp_path / "out")]) == 0
    with open(tmp_path / "out" / "recall_curves.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 7 and set(recall_curves.COLUMNS) == set(table[0])
    assert (tmp_path / "out" / "recall_curves.png").stat().st_size > 0


@pytest.mark.slow  # a trained run (7 s when this worker has none yet); the quick subset gathers written ones
def test_gather_reads_a_real_run_and_says_when_there_is_none(tiny_run, tmp_path, capsys):
    rows = recall_curves.gather([tiny_run])
    assert len(rows) == 1 and rows[0]["mixer"] == "softmax" and rows[0]["best"]
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
