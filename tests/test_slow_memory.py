"""Gathering the memorize sweep: facts stored, MLP parameters, bits per parameter, random-key capacity."""

import csv
import json
import math

import pytest
from omegaconf import OmegaConf

from conftest import compose_config
from tmem.memory.capacity import capacity_theory
from tmem.sweeps import slow_memory


def fake_run(root, name, score, expansion, accuracy, num_facts=1024, status="completed"):
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    cfg = compose_config(["experiment=memorize", f"mlp={score}", f"mlp.expansion={expansion}",
                          f"task.num_facts={num_facts}"])
    OmegaConf.save(cfg, run / ".hydra" / "config.yaml")
    (run / "summary.json").write_text(json.dumps({"eval/accuracy": accuracy, "status": status, "steps": 4000}))
    return run


def test_parameters_facts_and_bits_per_parameter(tmp_path):
    fake_run(tmp_path, "a", "relu", 2, 0.5)
    fake_run(tmp_path, "b", "swiglu", 2, 0.25)
    fake_run(tmp_path, "c", "relu2", 4, 1.0)
    rows = {r["score"]: r for r in slow_memory.gather([tmp_path])}
    d = 16
    relu, swiglu, relu2 = rows["relu"], rows["swiglu"], rows["relu2"]
    assert (relu["hidden"], relu["mlp_params"]) == (32, 2 * d * 32)
    assert swiglu["mlp_params"] == 3 * d * 32  # the gate has its own weights
    assert relu["facts_stored"] == 512 and swiglu["facts_stored"] == 256
    assert relu["bits_per_param"] == pytest.approx(512 * math.log2(64) / (2 * d * 32))
    assert relu["random_key_capacity"] == pytest.approx(capacity_theory("relu", d), abs=0.1)
    assert relu["random_key_facts"] == 32  # min(hidden units, capacity 2d + 1 = 33)
    assert relu2["random_key_facts"] == 64  # hidden units bind before the capacity (about 193)
    # without checkpoints convergence is known only when every fact is stored
    assert relu2["converged"] and not relu["converged"]


@pytest.mark.parametrize("mlp", [["mlp=relu", "mlp.bias=true", "mlp.expansion=2"],
                                 ["mlp=swiglu", "mlp.bias=true", "mlp.expansion=2"],
                                 ["mlp=moe", "mlp.score=swiglu", "mlp.bias=true"], ["mlp=pkm", "mlp.heads=2"]],
                         ids=lambda o: " ".join(o))
def test_mlp_parameter_count_matches_the_model(mlp):
    from tmem.config import validate
    from tmem.model import build_model, count_params

    cfg = validate(compose_config(["experiment=memorize", *mlp]))
    active, total = cfg.mlp.parameters(16)
    assert total == count_params(build_model(cfg, cfg.task).blocks[0].mlp)
    assert active == total if mlp[0] in ("mlp=relu", "mlp=swiglu") else active < total


def test_a_mixture_is_gathered_at_its_active_and_total_parameters(tmp_path):
    fake_run(tmp_path, "moe", "moe", 0.5, 0.25)
    (row,) = slow_memory.gather([tmp_path])
    router, expert = 16 * 8, 2 * 16 * 8  # 8 experts of 8 hidden units, top 2
    assert (row["score"], row["active_params"], row["mlp_params"]) == ("moe relu top2/8", router + 2 * expert,
                                                                       router + 8 * expert)
    assert row["hidden"] is None and row["random_key_facts"] is None and row["facts_stored"] == 256


def test_main_writes_the_table_and_figure(tmp_path, capsys):
    for i, e in enumerate((0.5, 1, 2)):
        fake_run(tmp_path / "sweep", str(i), "relu", e, 0.2 * (i + 1))
    fake_run(tmp_path / "sweep", "moe", "moe", 0.5, 0.5)  # drawn at its active parameters too
    assert slow_memory.main([str(tmp_path / "sweep")]) == 0
    with open(tmp_path / "sweep" / "slow_memory.csv") as f:
        assert len(list(csv.DictReader(f))) == 4
    assert (tmp_path / "sweep" / "slow_memory.png").stat().st_size > 0
    assert "bits/param" in capsys.readouterr().out
    assert slow_memory.main([str(tmp_path / "empty")]) == 2
