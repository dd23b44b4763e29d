"""The gd_match probe: exact agreement on constructed models, the report through the eval frame,
and (slow) a trained layer that converges to one GD step."""

import dataclasses
import json

import jax
import numpy as np
import pytest

from conftest import TINY_LINREG, run_entry
from tasks.linreg import LinReg
from tmem.model import build_model
from tmem.probes import PROBES
from tmem.probes import learners as L
from tmem.probes.gd_construction import load_construction
from tmem.probes.gd_match import Prompts, compare, figures, fit_learners, gd_match

SMALL = {"fit_tasks": 1024, "gdpp_fit_tasks": 512, "max_steps": 2, "ood_scales": [1.0, 2.0]}


def test_compare_is_scale_free():
    rng = np.random.default_rng(0)
    pred, sens = rng.normal(size=100), rng.normal(size=(100, 4))
    same = compare(pred, sens, pred, sens)
    assert same["sensitivity_cosine"] == pytest.approx(1.0) and same["prediction_diff"] == 0.0
    scaled = compare(2 * pred, 2 * sens, pred, sens)
    assert scaled["sensitivity_cosine"] == pytest.approx(1.0)
    assert scaled["sensitivity_distance"] == pytest.approx(1.0) and scaled["prediction_diff"] == pytest.approx(1.0)
    flipped = compare(pred, -sens, pred, sens)
    assert flipped["sensitivity_cosine"] == pytest.approx(-1.0)


def test_scaled_prompts_are_the_task_with_a_wider_input_range():
    task = LinReg(dim=3, num_examples=5, noise_std=0.1)
    key = jax.random.key(0)
    scaled = Prompts.sample(task, key, 32).scaled(2.5)
    wide = Prompts.sample(dataclasses.replace(task, input_range=2.5), key, 32)
    for a, b in ((scaled.x, wide.x), (scaled.y, wide.y)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_probe_on_the_constructed_layer_reports_exact_agreement(tiny_cfg, tmp_path):
    cfg, _ = tiny_cfg(base=TINY_LINREG)
    model, key = build_model(cfg, cfg.task), jax.random.key(3)
    X, Y, xq, yq = Prompts.sample(cfg.task, key, SMALL["fit_tasks"]).parts  # the probe's own fit set
    eta = float(L.one_step_eta(X, Y, xq, yq))
    load_construction(model, cfg, [eta])
    report, arrays = gd_match(model, cfg, key, {**SMALL, "max_steps": 1})  # GD++ is the next test's
    assert report["eta"] == pytest.approx(eta, rel=1e-6)
    assert report["model_loss"] == pytest.approx(report["gd_loss"], rel=1e-5)
    assert report["prediction_diff"] < 1e-5 and report["sensitivity_distance"] < 1e-5
    assert report["sensitivity_cosine"] == pytest.approx(1.0, abs=1e-6)
    assert report["construction_cosine"] == pytest.approx(1.0, abs=1e-6)
    assert report["construction_eta"] == pytest.approx(eta, rel=1e-5)
    assert report["closest_learner"] == "gd_1"
    assert np.allclose(report["ood"]["gd_1_sensitivity_cosine"], 1.0, atol=1e-6)
    assert report["ood"]["model_loss"][1] > report["ood"]["model_loss"][0]  # GD's eta overshoots out of range
    assert report["learners"]["least_squares"]["loss"] < 1e-6  # noiseless, N > d
    assert report["loss_vs_steps"] == {"steps": [1], "gd": [report["gd_loss"]], "gdpp": [report["gd_loss"]]}
    json.dumps(report)  # the eval frame writes it as JSON
    for name, fig in figures(report, arrays, 1).items():
        fig.savefig(tmp_path / f"{name}.png")
        assert (tmp_path / f"{name}.png").stat().st_size > 0


@pytest.mark.slow  # 3 s; the quick subset matches a one-layer model
def test_probe_compares_a_deeper_model_with_gd_plus_plus(tiny_cfg):
    cfg, _ = tiny_cfg("model.depth=2", "model.tie_blocks=true", base=TINY_LINREG)
    model, key = build_model(cfg, cfg.task), jax.random.key(3)
    fitted = fit_learners(Prompts.sample(cfg.task, key, SMALL["fit_tasks"]), 2, 2, SMALL["gdpp_fit_tasks"], 0.0)
    load_construction(model, cfg, fitted["gdpp_2"]["etas"], fitted["gdpp_2"]["gammas"])
    report, _ = gd_match(model, cfg, key, SMALL)
    assert report["gd_steps"] == 2 and report["construction_cosine"] is None
    assert report["closest_learner"] == "gdpp_2"
    assert report["gdpp_sensitivity_cosine"] == pytest.approx(1.0, abs=1e-5)
    assert report["sensitivity_cosine"] < 0.999 and report["gdpp_loss"] < report["gd_loss"]
    curve = report["loss_vs_steps"]
    assert curve["gdpp"][1] < curve["gd"][1] < curve["gd"][0]
    layers = report["learners"]["gdpp_layers_2"]
    assert len(layers["etas"]) == len(layers["gammas"]) == 2 and np.isfinite(report["gdpp_layers_loss"])


def test_probe_applies_to_regression_runs_only(tiny_cfg):
    mqar, _ = tiny_cfg()
    linreg, _ = tiny_cfg(base=TINY_LINREG)
    assert "task=linreg" in PROBES["gd_match"].applies(mqar)
    assert PROBES["gd_match"].applies(linreg) is None
    softmax, _ = tiny_cfg("mixer=softmax", "mixer.heads=1", base=TINY_LINREG)
    assert "needs a token task" in PROBES["induction"].applies(softmax)  # a vector run has no vocabulary


@pytest.mark.slow
def test_one_layer_trained_with_the_commands_converges_to_one_gd_step(tmp_path):
    """train.py experiment=icl_gd cut to 800 steps (it converges by about 450), then eval.py."""
    args = ["experiment=icl_gd", "train.steps=800", "task.heldout_size=4000"]
    done = run_entry("train.py", *args, "logger=disabled", f"hydra.run.dir={tmp_path}", optimised=True)
    assert done.returncode == 0, done.stderr[-3000:]
    done = run_entry("eval.py", f"run={tmp_path}", "probes=[gd_match]", "logger=disabled",
                     "+options.gd_match.max_steps=2", "+options.gd_match.ood_scales=[1.0,2.0]", optimised=True)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "eval" / "report.json").read_text())["gd_match"]
    assert abs(report["model_loss"] / report["gd_loss"] - 1) < 0.01
    assert report["sensitivity_cosine"] > 0.99 and report["construction_cosine"] > 0.99
    for name in ("gd_match_loss_vs_steps", "gd_match_predictions", "gd_match_ood"):
        assert (tmp_path / "eval" / f"{name}.png").stat().st_size > 0
