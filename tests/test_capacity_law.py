"""The capacity law of a sweep over memory sizes: runs named by their memory, seeds folded, a power law fitted per
kind of memory below saturation, on runs whose accuracies follow a known law."""

import csv
import json
import math

import pytest
from omegaconf import OmegaConf

from tmem.sweeps import capacity_law
from tmem.sweeps.runs import memory


def config(mixer="softmax", window=None, mixers=None, width=32, seq_len=64, pairs=16, seed=0):
    return OmegaConf.create({"mixer": {"name": mixer, "window": window, "lr": 1e-2},
                             "model": {"width": width, "mixers": mixers}, "optim": {"lr": None},
                             "task": {"seq_len": seq_len, "num_kv_pairs": pairs}, "train": {"seed": seed}})


def test_a_run_is_named_by_its_memory_its_window_and_its_hybrid_layers():
    assert memory(config("deltanet")) == "deltanet"
    assert memory(config(window=8)) == "softmax w8"
    hybrid = [{"name": "gated_deltanet", "heads": 4}, {"name": "softmax", "window": 8}]
    assert memory(config(mixers=hybrid)) == "gated_deltanet+softmax w8"
    # a layer named by its row alone takes the mixer group's knobs where it is the group's row
    assert memory(config(window=16, mixers=["gated_deltanet", "softmax"])) == "gated_deltanet+softmax w16"
    assert memory(config("deltanet", mixers=["gated_deltanet", "softmax"])) == "gated_deltanet+softmax"
    assert [capacity_law.kind(m) for m in ("softmax w8", "gated_deltanet+softmax w8", "deltanet")] == [
        "softmax", "gated_deltanet+softmax", "deltanet"]


def test_the_power_law_is_recovered_exactly_and_refused_without_two_sizes():
    a, b = capacity_law.power_law([64, 256, 1024], [3 * s**0.5 for s in (64, 256, 1024)])
    assert (a, b) == (pytest.approx(3.0), pytest.approx(0.5))
    assert capacity_law.power_law([64, 64], [1.0, 2.0]) is None
    assert capacity_law.power_law([64, 256], [0.0, 2.0]) is None


def fake_run(root, name, cfg, accuracy, state_size):
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    OmegaConf.save(cfg, run / ".hydra" / "config.yaml")
    given = [f"mixer={cfg.mixer.name}", f"model.width={cfg.model.width}", f"train.seed={cfg.train.seed}",
             *([f"mixer.window={cfg.mixer.window}"] if cfg.mixer.window else [])]
    OmegaConf.save(OmegaConf.create(given), run / ".hydra" / "overrides.yaml")
    (run / "summary.json").write_text(json.dumps({"eval/accuracy": accuracy, "state_size": state_size,
                                                  "status": "completed", "steps": 10}))


P = 16  # pairs per sequence


def known_laws(sweep):
    law = {"deltanet": (0.25, 0.5), "softmax": (0.01, 1.0)}  # recalled pairs = a * state^b, below saturation
    sizes = {"deltanet": {16: 256, 32: 1024, 64: 4096}, "softmax": {8: 448, 16: 960}}
    for k, by_size in sizes.items():
        a, b = law[k]
        for size_knob, state in by_size.items():
            acc = min(a * state**b / P, 1.0)
            for seed, spread in enumerate((0.0, -0.05, 0.05)):  # the median is the law's accuracy
                window = size_knob if k == "softmax" else None
                width = 32 if k == "softmax" else size_knob
                cfg = config(k, window=window, width=width, seed=seed)
                fake_run(sweep, f"{k}-{size_knob}-{seed}", cfg, min(acc + spread, 1.0), state)
    full = config("softmax", width=32)  # the full cache joins the windows' kind, saturated: left out of the fit
    fake_run(sweep, "softmax-full-0", full, 0.999, 8192)
    return law


def test_each_kind_gets_the_law_its_unsaturated_medians_follow(tmp_path):
    sweep = tmp_path / "sweep"
    law = known_laws(sweep)
    found = capacity_law.points(capacity_law.gather([sweep]))
    assert len(found) == 6 and {p["kind"] for p in found} == {"deltanet", "softmax"}
    d16 = next(p for p in found if p["memory"] == "deltanet" and p["width"] == 16)
    assert (d16["n"], d16["seeds"], d16["recalled"]) == (3, "0,1,2", pytest.approx(4.0))
    assert d16["recalled_min"] == pytest.approx((0.25 - 0.05) * 16)
    assert [p["fitted"] for p in found if p["kind"] == "deltanet"] == [True, True, False]  # 4096: every pair
    fitted = {w["kind"]: w for w in capacity_law.laws(found)}
    for k, (a, b) in law.items():
        assert (fitted[k]["a"], fitted[k]["b"]) == (pytest.approx(a), pytest.approx(b))
        assert fitted[k]["state_for_all"] == pytest.approx((P / a) ** (1 / b))
    assert fitted["softmax"]["n"] == 2  # the two windows, not the saturated full cache


@pytest.mark.slow  # the figure's PNG and SVG: seconds on a loaded CPU
def test_the_command_prints_each_law_and_writes_the_plotted_points(tmp_path, capsys):
    sweep, out = tmp_path / "sweep", tmp_path / "out"
    known_laws(sweep)
    assert capacity_law.main([str(sweep), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "deltanet (T=64, 16 pairs): recalled = 0.25 * state^0.500 over 2 sizes; every pair at state 4096" in printed
    with open(out / "capacity_law.csv") as f:
        table = list(csv.DictReader(f))
    assert [r["mark"] for r in table].count("law") == 2 and len(table) == 8
    assert math.isclose(float(next(r for r in table if r["mark"] == "law" and r["kind"] == "softmax")["b"]), 1.0)
    assert (out / "capacity_law.png").stat().st_size > 0
    assert capacity_law.main([str(sweep), "--out", str(out)]) == 2  # kept unless --force
