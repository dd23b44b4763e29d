"""The training loop in-process: learning, exact resume, NaN stop, summaries."""

import json

import jax
import numpy as np
import pytest
from flax import nnx

from conftest import TINY, TINY_LINREG, compose_config, quick_only
from golden import MLP_SWITCHES, cases
from tasks import heldout
from tmem.config import validate
from tmem.model import build_model
from tmem.train.build import build
from tmem.train.checkpoint import CheckpointError, Checkpoints
from tmem.train.loop import CPU_LLVM_LEVEL, TrainingDiverged, compiler_options, run
from tmem.train.mesh import data_mesh
from tmem.train.optim import build_optimizer
from tmem.train.restore import load_run
from tmem.train.step import init_state, make_eval, make_gradients, make_loss, make_train_step


def params_of(run_dir):
    _, model, step, history = load_run(run_dir)
    return step, jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.Param)))


@pytest.mark.slow  # 7 s from a cold cache; the quick subset trains in tests/test_entry_points.py
def test_loss_goes_down(tiny_cfg, tmp_path):
    cfg, resolved = tiny_cfg("train.steps=150", "train.eval_every=150", "train.early_stop=false")
    summary = run(cfg, tmp_path, resolved)
    # an untrained model's loss is about log(vocab)
    assert summary["eval/loss"] < np.log(cfg.task.vocab) - 0.5
    assert summary["steps"] == 150 and summary["status"] == "completed"


@pytest.mark.slow  # 6 s from a cold cache; the quick subset trains in tests/test_entry_points.py
def test_summary_fields(tiny_cfg, tmp_path):
    cfg, resolved = tiny_cfg()
    summary = run(cfg, tmp_path, resolved)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == summary
    for key in ("eval/accuracy", "eval/loss", "steps", "wall_seconds", "target_step", "target_seconds",
                "parameters", "devices", "state_size", "state_size_per_token", "checkpoint_dir", "wandb_dir"):
        assert key in summary
    assert summary["devices"] == jax.device_count() == 1  # tests/test_mesh.py trains on two, in a process of its own
    assert summary["state_size"] == 2 * 16 * 16 * 2  # keys and values, width 16, T 16, 2 layers
    assert summary["parameters"] == sum(x.size for x in jax.tree.leaves(params_of(tmp_path)[1]))


@pytest.mark.slow
def test_resume_is_bit_exact(tiny_cfg, tmp_path):
    """N steps straight == k steps, stop, resume, N-k steps (same sampled batches, same optimizer state)."""
    cfg, resolved = tiny_cfg("train.steps=25", "train.early_stop=false")
    run(cfg, tmp_path / "straight", resolved)
    cfg_k, resolved_k = tiny_cfg("train.steps=25", "train.early_stop=false", "train.stop_after=12")
    paused = run(cfg_k, tmp_path / "resumed", resolved_k)
    assert paused["status"] == "paused" and paused["steps"] == 12
    cfg_r, resolved_r = tiny_cfg("train.steps=25", "train.early_stop=false", "train.resume=true")
    resumed = run(cfg_r, tmp_path / "resumed", resolved_r)
    assert resumed["resumed_from"] == 12 and resumed["steps"] == 25
    step_a, a = params_of(tmp_path / "straight")
    step_b, b = params_of(tmp_path / "resumed")
    assert step_a == step_b == 25
    jax.tree.map(np.testing.assert_array_equal, a, b)


@pytest.mark.slow  # two runs: 4 s from a cold cache
def test_checkpoints_keep_all_or_last_k(tiny_cfg, tmp_path):
    for keep, expected in (("null", [5, 10, 15, 20]), ("2", [15, 20])):
        cfg, resolved = tiny_cfg("train.checkpoint_every=5", f"train.keep_checkpoints={keep}",
                                 "train.early_stop=false")
        run(cfg, tmp_path / keep, resolved)
        ckpts = Checkpoints(tmp_path / keep / "checkpoints")
        assert ckpts.steps() == expected
        assert ckpts.config()["model"]["width"] == 16  # the config rides along as metadata
        assert "eval/accuracy" in ckpts.metrics(20)


@pytest.mark.slow
def test_nonfinite_loss_stops_and_keeps_the_last_good_checkpoint(tiny_cfg, tmp_path):
    # Ten good steps end with a checkpoint; resumed with an absurd learning rate, the loss blows up.
    common = ("train.steps=200", "train.checkpoint_every=10", "train.log_every=1", "train.keep_checkpoints=null",
              "train.early_stop=false")
    cfg, resolved = tiny_cfg(*common, "train.stop_after=10")
    run(cfg, tmp_path, resolved)
    cfg, resolved = tiny_cfg(*common, "train.resume=true", "optim.lr=1e30", "optim.warmup_steps=0",
                             "optim.schedule=constant")
    with pytest.raises(TrainingDiverged, match=r"loss became NaN/Inf at step 1\d; stopped at step 1\d; "
                                               r"the last good checkpoint is step 10 in .*checkpoints"):
        run(cfg, tmp_path, resolved)
    assert Checkpoints(tmp_path / "checkpoints").steps() == [10]
    step, params = params_of(tmp_path)
    assert step == 10 and all(np.isfinite(x).all() for x in jax.tree.leaves(params))
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "diverged"


@pytest.mark.slow
def test_a_finite_divergence_stops_and_keeps_the_last_good_checkpoint(tiny_cfg, tmp_path):
    # resumed at a learning rate of 1e4 the loss stays finite but far above chance (log 32 = 3.466) and the
    # untrained loss: the run stops at the third evaluation in a row above ten times the larger of the two, and
    # no diverging state replaces the checkpoint of step 10
    common = ("train.steps=200", "train.eval_every=2", "train.checkpoint_every=2", "train.early_stop=false")
    cfg, resolved = tiny_cfg(*common, "train.stop_after=10")
    run(cfg, tmp_path, resolved)
    cfg, resolved = tiny_cfg(*common, "train.resume=true", "optim.lr=1e4", "optim.warmup_steps=0",
                             "optim.schedule=constant")
    with pytest.raises(TrainingDiverged, match=r"held-out loss \S+ at step 16 has been above \S+ \(10 x the larger of "
                                               r"chance and the untrained loss\) at 3 evaluations in a row; the last "
                                               r"good checkpoint is step 10"):
        run(cfg, tmp_path, resolved)
    assert Checkpoints(tmp_path / "checkpoints").steps() == [10]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "diverged" and np.isfinite(summary["eval/loss"]) and summary["eval/loss"] > 34.66


def test_a_cpu_run_compiles_at_its_own_llvm_level_unless_xla_flags_set_one(monkeypatch):
    """train.py's programs take CPU_LLVM_LEVEL on a CPU; a level in XLA_FLAGS (the suite's own 0) is left to win."""
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    assert compiler_options(data_mesh()) == {"xla_backend_optimization_level": CPU_LLVM_LEVEL}
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0")
    assert compiler_options(data_mesh()) is None


def test_chance_is_the_loss_of_zero_outputs(tiny_cfg):
    from tmem.train.build import build
    from tmem.train.step import chance_loss

    # uniform logits over the vocabulary of 32; the zero predictor of regression: half the mean squared label
    for base, want in ((TINY, lambda b: np.log(32)), (TINY_LINREG, lambda b: 0.5 * np.mean(b.targets ** 2))):
        cfg, _ = tiny_cfg(base=base)
        built = build(cfg)
        batch = heldout(cfg.task)
        assert chance_loss(built.graphdef, cfg.task, built.state.params, built.state.rest, batch) == \
            pytest.approx(float(want(batch)), rel=1e-5)


@pytest.mark.slow  # 7 s: trains and resumes; the quick subset's resume refusals are test_rundir's, before a step
def test_resuming_with_another_optimizer_structure_fails_clearly(tiny_cfg, tmp_path):
    cfg, resolved = tiny_cfg("train.stop_after=10")
    run(cfg, tmp_path, resolved)
    cfg, resolved = tiny_cfg("train.resume=true", "optim.clip_norm=null")
    with pytest.raises(CheckpointError, match="does not fit this config") as e:
        run(cfg, tmp_path, resolved)
    assert "\n" not in str(e.value) and len(str(e.value)) < 500


@pytest.mark.slow
def test_microbatched_gradient_equals_the_whole_batch(tiny_cfg):
    cfg, _ = tiny_cfg()
    graphdef, state = init_state(build_model(cfg, cfg.task), build_optimizer(cfg.optim, 10), 0)
    key = jax.random.key(3)
    # jitted: op by op, each operation would compile a program of its own (8.7 s against 5.5, alone)
    metrics, grads = jax.jit(make_gradients(graphdef, cfg.task, 16, microbatch=4))(state.params, state.rest, key)
    # the same 16 examples, the batch of the step's key, differentiated at once
    (_, whole_metrics), whole = jax.jit(jax.value_and_grad(make_loss(graphdef, cfg.task), has_aux=True))(
        state.params, state.rest, cfg.task.sample(key, 16))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), grads, whole)
    np.testing.assert_allclose(metrics["loss"], whole_metrics["loss"], rtol=1e-6)


@pytest.mark.slow  # 4 s; evaluation's chunks are also run by every training test
def test_chunked_eval_equals_one_pass(tiny_cfg):
    cfg, _ = tiny_cfg("task.heldout_size=50")
    graphdef, state = init_state(build_model(cfg, cfg.task), build_optimizer(cfg.optim, 10), 0)
    batch = heldout(cfg.task)
    whole = make_eval(graphdef, cfg.task, chunk=50)(state.params, state.rest, batch)
    chunked = make_eval(graphdef, cfg.task, chunk=16)(state.params, state.rest, batch)  # pads 50 -> 64
    for k in whole:
        np.testing.assert_allclose(chunked[k], whole[k], rtol=1e-5)


def test_a_row_evaluates_in_its_eval_form_with_the_same_parameters(tiny_cfg):
    """GLA's held-out evaluation reads in the token scan (mixer.run.eval_form): the trained parameters
    through another form of the same function, so the metrics agree with the training form's to float rounding."""
    from tmem.mixers.fast_weight import FastWeight
    from tmem.train.build import build, evaluation_graphdef

    def forms(graphdef):
        model = nnx.merge(graphdef, state.params, state.rest)
        return {m.cfg.run.form for _, m in nnx.iter_graph(model) if isinstance(m, FastWeight)}

    cfg, _ = tiny_cfg("mixer=gla", "model.depth=1")
    graphdef, state, _, _ = build(cfg)
    scan = evaluation_graphdef(graphdef, state.params, state.rest)
    assert forms(graphdef) == {"chunked"} and forms(scan) == {"recurrent"}
    batch = heldout(cfg.task)
    chunked = make_eval(graphdef, cfg.task)(state.params, state.rest, batch)
    scanned = make_eval(scan, cfg.task)(state.params, state.rest, batch)
    for k in chunked:
        np.testing.assert_allclose(scanned[k], chunked[k], rtol=1e-5)
    assert forms(graphdef) == {"chunked"}  # the model the evaluation was read from keeps its own form
    linear = build(tiny_cfg("mixer=linear")[0])
    assert evaluation_graphdef(linear.graphdef, linear.state.params, linear.state.rest) is linear.graphdef


def test_the_heldout_probe_reads_a_row_in_its_eval_form_on_a_longer_task(tiny_cfg, monkeypatch):
    """eval.py's held-out probe evaluates as training does, in the row's evaluation form, and a task override (a
    longer sequence) keeps the model's own structure: the token scan's numbers are the chunked form's."""
    import dataclasses

    import tmem.probes.heldout as probe
    from tmem.mixers.fast_weight import FastWeight
    from tmem.train.build import build

    cfg, _ = tiny_cfg("mixer=gla", "model.depth=1")
    model = build(cfg).model
    read = []

    def recording(graphdef, *args, **kwargs):  # the structure the probe evaluates through
        read.append(graphdef)
        return make_eval(graphdef, *args, **kwargs)

    monkeypatch.setattr(probe, "make_eval", recording)
    longer = dataclasses.replace(cfg.task, seq_len=24)
    got = probe.heldout_metrics(model, longer)
    scanned = nnx.merge(read[0], *nnx.split(model, nnx.Param, ...)[1:])
    assert {m.cfg.run.form for _, m in nnx.iter_graph(scanned) if isinstance(m, FastWeight)} == {"recurrent"}
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    want = make_eval(graphdef, longer)(params, rest, heldout(longer))
    assert set(got) == set(want)
    for k in want:
        assert got[k] == pytest.approx(float(want[k]), rel=1e-5), k


@pytest.mark.slow
def test_the_default_job_reaches_99_percent(tmp_path):
    """train.py with no overrides: held-out accuracy 0.99 within its steps (250 to 400 over six seeds). Run as a
    user runs it, on the machine's CPU devices at train.py's own LLVM level: in this process's one device its
    steps take 2.5 times as long (18 s to the target against 7)."""
    from conftest import run_entry

    done = run_entry("train.py", "logger=disabled", f"hydra.run.dir={tmp_path}", optimised=True)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["eval/accuracy"] >= 0.99 and summary["target_step"] <= 1000, summary


# every row (golden's cases of each mixer on tokens), the grid's default cell and every MLP
STATES = {**{c: o for c, o in cases().items() if c.startswith("tokens-") and c.count("-") == 1},
          "tokens-regression": [*TINY, "mixer=regression"],
          **{f"tokens-softmax-{m}": cases()[f"tokens-softmax-{m}"] for m in MLP_SWITCHES}}


@pytest.mark.parametrize("case", quick_only(sorted(STATES), quick={"tokens-mesa"}))
def test_every_rows_step_returns_the_state_it_takes(case):
    """The step's output state has its input's shapes and types, weak types included: a run compiles its step
    once, not again at the second call."""
    cfg = validate(compose_config(STATES[case]))
    graphdef, state, tx, schedule = build(cfg)
    step = make_train_step(graphdef, cfg.task, tx, cfg.train.batch_size, schedule)
    after, _ = jax.eval_shape(step, state)
    aval = lambda x: (x.shape, x.dtype, x.weak_type)
    assert jax.tree.map(aval, after) == jax.tree.map(lambda x: aval(jax.typeof(x)), state)
