"""The slow memory's candidate predictors of its capacity, each on a constructed MLP whose answer is known."""

import json

import numpy as np
import pytest
from omegaconf import OmegaConf

from tmem.probes.mlp_keys import coherence, participation, properties
from tmem.sweeps import mlp_capacity


def test_orthogonal_keys_have_full_rank_and_no_overlap():
    w_in = np.eye(8)[:, :6] * 3.0  # six orthogonal keys of norm 3 in width 8 (columns of W_in)
    code = np.kron(np.eye(6), np.ones((4, 1)))  # 24 facts, each read by one unit: a one-hot code over 6 units
    p = properties(w_in, code)
    assert p["key_rank"] == pytest.approx(6.0) and p["code_rank"] == pytest.approx(6.0)
    assert (p["key_coherence"], p["key_coherence_max"]) == (0.0, 0.0)
    assert p["code_units"] == pytest.approx(1.0) and p["bias_spread"] == 0.0 and p["hidden"] == 6


def test_repeated_keys_span_fewer_directions_and_overlap_fully():
    base = np.eye(4)[:, :2]  # two directions, each key repeated three times with a sign flip: rank 2
    w_in = np.concatenate([base, -base, 2 * base], axis=1)
    mean_cos, max_cos = coherence(w_in.T)
    # 6 keys: each has 2 copies of its own direction (|cos| 1) and 3 orthogonal keys among 5 others
    assert (mean_cos, max_cos) == (pytest.approx(2 / 5), 1.0)
    p = properties(w_in, np.ones((5, 6)), bias=np.array([1.0, -1.0, 1.0, -1.0, 1.0, -1.0]))
    assert p["key_rank"] == pytest.approx(2.0) and p["code_rank"] == pytest.approx(1.0)
    assert p["bias_spread"] == pytest.approx(1.0 / np.mean([1, 1, 1, 1, 2, 2]))


def test_participation_counts_the_units_a_code_uses():
    assert participation(np.array([[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0]])).tolist() == [
        3.0, 0.0, 1.0]


def fake_run(root, name, score, expansion, seed, facts, **props):
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    (run / "eval").mkdir()
    OmegaConf.save(OmegaConf.create({"mlp": {"name": score, "expansion": expansion}, "train": {"seed": seed}}),
                   run / ".hydra" / "config.yaml")
    (run / "eval" / "report.json").write_text(json.dumps({"mlp_keys": {"facts_stored": facts, **props}}))


def fitted_and_held_out(root):
    """facts = 10 * hidden exactly for relu and relu2, 12 * hidden for the held-out gelu: a 1/6 miss there;
    key_rank says nothing (constant over the fitted runs), and no run has biases."""
    for score, per_unit in (("relu", 10), ("relu2", 10), ("gelu", 12)):
        for m in (8, 16, 32):
            fake_run(root, f"{score}-{m}", score, m / 16, 0, per_unit * m, hidden=m, key_rank=16.0,
                     key_coherence=0.1 * m, key_coherence_max=0.9, code_rank=float(m), code_units=2.0,
                     bias_spread=0.0)
    (root / "no-report" / ".hydra").mkdir(parents=True)  # a run never probed: not read


def test_the_predictor_is_fitted_on_some_scores_and_scored_on_the_others(tmp_path):
    fitted_and_held_out(tmp_path)
    runs = [mlp_capacity.read_run(r) for r in mlp_capacity.find_reports([tmp_path])]
    assert len(runs) == 9 and {r["score"] for r in runs} == {"relu", "relu2", "gelu"}
    laws = {w["property"]: w for w in mlp_capacity.predictors(runs, {"relu", "relu2"})}
    hidden = laws["hidden"]
    assert (hidden["alpha"], hidden["beta"], hidden["r2_fit"]) == (pytest.approx(10), pytest.approx(1), 1.0)
    assert hidden["heldout_error"] == pytest.approx(1 / 6) and (hidden["n_fit"], hidden["n_heldout"]) == (6, 3)
    assert "no positive value" in laws["bias_spread"]["note"] and "one value" in laws["key_rank"]["note"]


@pytest.mark.slow  # the figure's PNG and SVG: several seconds on a loaded CPU
def test_the_command_prints_each_predictor_and_writes_its_table(tmp_path, capsys):
    fitted_and_held_out(tmp_path / "runs")
    out = tmp_path / "out"
    assert mlp_capacity.main([str(tmp_path / "runs"), "--fit", "relu,relu2", "--out", str(out)]) == 0
    assert "hidden: facts = 10 * p^1.000, R^2 1.000 on 6 runs, median error 16.7% held out" in capsys.readouterr().out
    lines = (out / "mlp_capacity.csv").read_text().splitlines()
    assert sum(line.startswith("predictor,") for line in lines) == len(mlp_capacity.PROPERTIES)
    assert sum(line.startswith("run,") for line in lines) == 9


@pytest.mark.slow  # builds and runs a model (a few seconds on a loaded CPU)
def test_the_probe_reads_a_memorize_model_and_counts_its_facts_as_the_model_does():
    import jax.numpy as jnp

    from conftest import compose_config
    from tasks import heldout
    from tmem.config import validate
    from tmem.model import build_model
    from tmem.probes import PROBES, ProbeInput

    cfg = validate(compose_config(["experiment=memorize", "task.num_facts=64", "task.num_values=4", "task.seq_len=16",
                                   "train.batch_size=4", "mlp.expansion=2", "logger=disabled"]))
    model = build_model(cfg, cfg.task)  # untrained: it stores the facts its random map gets right by chance
    metrics, _ = PROBES["mlp_keys"].run(ProbeInput(cfg=cfg, model=model))
    batch = heldout(cfg.task)
    F = cfg.task.num_facts
    right = jnp.argmax(model(batch.inputs)[..., F:], -1) == batch.targets - F
    assert metrics["facts_stored"] == int(right.sum()) and metrics["facts"] == 64
    assert metrics["hidden"] == 32 and 1 < metrics["key_rank"] <= cfg.model.width  # 32 keys in width 16
    assert 0 < metrics["key_coherence"] < metrics["key_coherence_max"] <= 1
    assert metrics["bias_spread"] == 0.0  # tmem's MLPs have no biases by default
    assert PROBES["mlp_keys"].applies(validate(compose_config(["experiment=memorize", "mlp=swiglu"])))
