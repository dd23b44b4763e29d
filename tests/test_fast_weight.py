"""The fast-weight mixers in the LM: every row builds, is causal, its two forms agree, it continues, it trains."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import TINY, quick_only, run_entry
from tmem.config import ConfigError
from tmem.mixers.fast_weight import FastWeight, FastWeightConfig

ROWS = ("linear", "retnet", "gla", "mamba2", "deltanet", "gated_deltanet")


# the quick subset: a per-channel decay and a gated delta rule (tests/test_chunked.py runs every branch quick)
@pytest.mark.parametrize("row", quick_only(ROWS, {"gla", "gated_deltanet"}))
def test_every_row_is_causal_and_its_chunked_form_equals_its_recurrence(model_and_tokens, row):
    # chunk 5 does not divide T = 16; GLA's vector decay then keeps per-channel blocks of 5
    cfg, model, tokens = model_and_tokens(f"mixer={row}", "mixer.run.chunk=5")
    _, reference, _ = model_and_tokens(f"mixer={row}", "mixer.run.form=recurrent")  # same seed, same weights
    t = 7
    changed = tokens.at[:, t + 1:].set((tokens[:, t + 1:] + 5) % cfg.task.vocab)
    a, b, c = jax.jit(lambda m, r, x, y: (m(x), m(y), r(x)))(model, reference, tokens, changed)
    np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(a[:, :t + 1], b[:, :t + 1], rtol=1e-5, atol=1e-5)
    assert not np.allclose(a[:, t + 1:], b[:, t + 1:])


def test_state_size_counts_what_a_call_hands_on(model_and_tokens):
    cfg, model, tokens = model_and_tokens("mixer=gla", "mixer.feature_map=dpfp", "mixer.dpfp_nu=2")
    _, states = jax.jit(lambda m, t: m.forward(t))(model, tokens)
    per_example = sum(x.size for x in jax.tree.leaves(states[0])) // tokens.shape[0]
    assert per_example == cfg.mixer.state_size(cfg.model.width, cfg.task.seq_len)
    # 2 heads of 8-wide keys: dpfp with nu = 2 makes 32-wide features, the memory 32 x 8 per head
    assert states[0].memory.shape == (tokens.shape[0], 2, 32, 8)


def test_positions_read_out_the_same_logits_and_the_state_is_captured(model_and_tokens):
    cfg, model, tokens = model_and_tokens("mixer=linear", "mixer.feature_map=elu", "mixer.normalize=true")
    positions = jnp.array([[0, 5], [3, 15], [9, 9]])
    full, picked, (_, intermediates) = jax.jit(lambda m, t, p: (m(t), m(t, positions=p), nnx.capture(
        m, nnx.Intermediate)(t)))(model, tokens, positions)
    np.testing.assert_allclose(picked, jnp.take_along_axis(full, positions[..., None], 1), rtol=1e-5, atol=1e-5)
    state = intermediates["blocks"][0]["mixer"]["state"][0]
    assert state.shape == (tokens.shape[0], cfg.mixer.heads, 8, 8 + 1)  # the normaliser is one more value column


def test_gated_delta_with_no_decay_is_deltanet():
    """alpha_t = exp(-exp(A_log) dt_t) = 1 when exp(A_log) = 0: the Gated DeltaNet layer becomes DeltaNet."""
    common = dict(rule="delta", write_strength="sigmoid", qk_norm="l2", heads=2)
    delta = FastWeight(FastWeightConfig(**common), 16, rope=False, rngs=nnx.Rngs(0))
    gated = FastWeight(FastWeightConfig(decay="scalar", **common), 16, rope=False, rngs=nnx.Rngs(1))
    for name in ("q", "k", "v", "beta", "out", "conv_q", "conv_k", "conv_v", "norm"):
        setattr(gated, name, getattr(delta, name))
    x = jax.random.normal(jax.random.key(2), (2, 9, 16))
    read = jax.jit(lambda m, x: m(x)[0])
    assert not np.allclose(read(gated, x), read(delta, x), atol=1e-3)  # a real decay differs
    gated.A_log[...] = jnp.full_like(gated.A_log[...], -jnp.inf)
    np.testing.assert_allclose(read(gated, x), read(delta, x), rtol=1e-6, atol=1e-6)


def test_the_output_gate_scales_each_read_by_its_activation():
    """With the gate's projection at zero, sigmoid passes half of the ungated read and silu passes nothing:
    silu's gate starts reads near zero, part of why it stalls heads of few values (MEMORY.md)."""
    layers = {}
    for name, extra in (("plain", {}), ("silu", dict(output_gate=True)),
                        ("sigmoid", dict(output_gate=True, gate_activation="sigmoid"))):
        layers[name] = FastWeight(FastWeightConfig(heads=2, **extra), 16, rope=False, rngs=nnx.Rngs(0))
    for name in ("silu", "sigmoid"):
        for part in ("q", "k", "v", "out", "conv_q", "conv_k", "conv_v", "norm"):
            setattr(layers[name], part, getattr(layers["plain"], part))
        layers[name].gate.kernel[...] = jnp.zeros_like(layers[name].gate.kernel[...])
    x = jax.random.normal(jax.random.key(2), (2, 9, 16))
    read = {name: jax.jit(lambda m, x: m(x)[0])(layer, x) for name, layer in layers.items()}
    assert np.abs(read["plain"]).max() > 0.1
    np.testing.assert_allclose(read["sigmoid"], 0.5 * read["plain"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(read["silu"], 0.0, atol=1e-7)


def test_the_forget_bias_sets_glas_first_decays():
    """With the gate's input weights at zero its logits are the bias b, so every decay is sigmoid(b)^(1/16):
    0.958 a token at fla's b = 0, 0.9989 at GLA's default b = 4."""
    x = jax.random.normal(jax.random.key(0), (2, 9, 16))
    for bias in (0.0, 4.0):
        layer = FastWeight(FastWeightConfig(decay="vector", heads=2, forget_bias=bias), 16, rope=False,
                           rngs=nnx.Rngs(0))
        layer.gate_down.kernel[...] = jnp.zeros_like(layer.gate_down.kernel[...])
        log_a, _ = layer.decay_and_strength(layer.projections(x))
        np.testing.assert_allclose(jnp.exp(log_a), jax.nn.sigmoid(bias) ** (1 / 16), rtol=1e-6)


@pytest.mark.parametrize("override, message", [
    ("mixer.forget_bias=4", "mixer.forget_bias=4.0 needs decay=vector"),
    ("mixer.a_range=[2,1]", r"mixer.a_range=\[2.0, 1.0\] must be \[low, high\] with 0 < low <= high"),
    ("mixer.gate_activation=tanh", "mixer.gate_activation='tanh' is not one of: silu, sigmoid"),
    ("mixer.qk_norm=none", "mixer.qk_norm must be l2 with rule=delta"),
    ("mixer.decay=none", "mixer.write_strength=dt needs decay=scalar"),
    ("mixer.decay=gamma", "mixer.decay='gamma' is not one of: none, fixed, scalar, vector"),
    ("mixer.run.eval_form=scan", "mixer.run.eval_form='scan' is not one of: null, auto, chunked, recurrent"),
    ("mixer.run.chunk=0", "mixer.run.chunk=0 must be positive"),
])
def test_bad_configs_get_one_line(tiny_cfg, override, message):
    row = "deltanet" if "qk_norm" in override else "mamba2"
    with pytest.raises(ConfigError, match=message):
        tiny_cfg(f"mixer={row}", override)
    with pytest.raises(ConfigError, match="mixer.normalize needs rule=add"):
        tiny_cfg("mixer=linear", "mixer.normalize=true")


@pytest.mark.parametrize("overrides, form", [
    (("mixer=deltanet",), "chunked"),  # one head of 64
    (("mixer=deltanet", "mixer.heads=4"), "recurrent"),  # four of 16
    (("mixer=gated_deltanet", "mixer.key_width=16"), "recurrent"),
    (("mixer=gated_deltanet", "mixer.heads=2"), "chunked"),  # two of 32
    (("mixer=deltanet", "mixer.heads=4", "mixer.run.eval_form=null"), "chunked"),  # null: the training form
    (("mixer=linear", "mixer.heads=4"), "chunked"),  # the add rule's chunked form evaluates faster at every width
    (("mixer=gla",), "recurrent"),  # its YAML's own choice
    (("experiment=capacity_gap", "mixer=gated_deltanet"), "recurrent"),  # the sweep pins four heads
])
def test_eval_form_auto_reads_a_delta_rule_with_narrow_keys_in_the_token_scan(tiny_cfg, overrides, form):
    cfg, _ = tiny_cfg(*overrides, base=["logger=disabled", "model.width=64"])
    assert cfg.mixer.run.form == "chunked" and cfg.mixer.for_evaluation().run.form == form


@pytest.mark.slow
def test_train_py_runs_a_fast_weight_row(tmp_path):
    # a per-channel decay's chunked form through train.py; the golden, continuation and chunked-form tests run
    # every row's math, and the delta rule trains on two devices in tests/test_mesh.py (a hybrid with Gated
    # DeltaNet): each row here costs a compile (one row's run 9 to 11 s in the suite, two rows' 18 s)
    done = run_entry("train.py", *TINY, "mixer=gla", "train.steps=10", f"hydra.run.dir={tmp_path}")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 10 and summary["state_size_per_token"] is None


@pytest.mark.slow
def test_deltanet_learns_recall_on_the_default_mqar_job(tmp_path):
    """The row's default config on the default job leaves the quarter plateau and reaches 90% held-out accuracy
    (about 300 steps; 0.99 takes about 850 steps, the README's table, which is measured by
    benchmarks/mqar_rows.py rather than paid for in every test run). Run as a user runs it, optimised: the
    chunked form's many small programs run 4x slower without LLVM's passes."""
    done = run_entry("train.py", "mixer=deltanet", "logger=disabled", "train.steps=1500", "train.target=0.9",
                     f"hydra.run.dir={tmp_path}", optimised=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["target_step"] is not None and summary["eval/accuracy"] >= 0.9, summary


def test_written_out_norms_equal_their_definitions():
    """The layer's RMSNorm equals nnx.RMSNorm's in values and gradients, and the L2 normalisation's written-out
    backward equals autodiff's."""
    from tmem.layers import l2_normalize as _l2_normalize
    from tmem.layers import rms_norm
    x, dy, scale = (jax.random.normal(jax.random.key(i), shape) for i, shape in
                    enumerate([(2, 5, 3, 8), (2, 5, 3, 8), (8,)]))
    norm = nnx.RMSNorm(8, epsilon=1e-5, rngs=nnx.Rngs(0))
    norm.scale[...] = scale
    np.testing.assert_allclose(rms_norm(x, scale, 1e-5), norm(x), rtol=1e-5, atol=1e-6)

    def rms_definition(x, scale):  # nnx.RMSNorm's value, differentiated by autodiff
        return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + 1e-5) * scale[None, None, None]

    np.testing.assert_allclose(rms_definition(x, scale), norm(x), rtol=1e-5, atol=1e-6)
    got, want = (jax.vjp(f, x, scale)[1](dy) for f in (lambda x, s: rms_norm(x, s, 1e-5), rms_definition))
    for a, b in zip(got, want):  # the input's and the scale's gradients
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    definition = lambda x: x * jax.lax.rsqrt(jnp.sum(jnp.square(x), axis=-1, keepdims=True) + 1e-6)  # noqa: E731
    (got,), (want,) = (jax.vjp(f, x)[1](dy) for f in (_l2_normalize, definition))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_l2_normalize(x), definition(x), rtol=1e-6, atol=1e-7)


def test_performer_features_are_drawn_once_kept_untrained_and_restored(tiny_cfg, tmp_path):
    """The projection is no Param (the optimizer's state and the gradients never hold it) but a variable of the
    train state's rest, which a checkpoint saves and restores; the row refuses to run unnormalised."""
    from tmem.model import build_model
    from tmem.train.checkpoint import Checkpoints
    from tmem.train.optim import build_optimizer
    from tmem.train.step import init_state

    cfg, _ = tiny_cfg("mixer=performer", "mixer.num_features=24")
    _, state = init_state(build_model(cfg, cfg.task), build_optimizer(cfg.optim, 10), seed=0)
    paths = lambda tree: {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(tree)}  # noqa: E731
    assert not any("features" in p for p in paths(state.params))
    drawn = {p: np.asarray(v[...]) for p, v in nnx.to_flat_state(state.rest) if "features" in map(str, p)}
    assert len(drawn) == 2 and all(w.shape == (8, 24) for w in drawn.values())  # one per layer, d_k = 8
    Checkpoints(tmp_path / "ck").save(state)
    restored = Checkpoints(tmp_path / "ck").restore(jax.eval_shape(lambda: state))
    back = {p: np.asarray(v[...]) for p, v in nnx.to_flat_state(restored.rest) if p in drawn}
    assert back.keys() == drawn.keys()
    for p in drawn:
        np.testing.assert_array_equal(back[p], drawn[p])
    with pytest.raises(ValueError, match="feature_map=performer needs mixer.normalize=true"):
        FastWeightConfig(feature_map="performer").check(16)
