"""Mamba-2's reference layer (anchors/mixers.md 1.3) against a plain written-out definition, and its knobs."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from conftest import quick_only
from tmem.mixers.fast_weight import FastWeight, FastWeightConfig, FastWeightRun

MAMBA2 = dict(decay="scalar", write_strength="dt", q_scale=1.0, skip=True, output_gate=True, heads=4)
REFERENCE = dict(qk_groups=1, conv_bias=True, output_norm_over="width", gate_before_norm=True, expand=0.5)
BEFORE = dict(qk_groups=None, conv_bias=False, output_norm_over="head", gate_before_norm=False, expand=1.0)


def silu(x):
    return x / (1 + np.exp(-x))


def rms_norm(x, scale):
    return x / np.sqrt(np.mean(x ** 2, axis=-1, keepdims=True) + 1e-5) * scale


def definition(layer: FastWeight, x):
    """Mamba-2 one token at a time in float64, from the layer's parameters: conv1d (with its bias) and SiLU
    over x, B and C; H_t = exp(-exp(A_log) dt_t) H_{t-1} + dt_t B_t x_t^T per head, B and C of head h from
    group h // (H / G); y_t = H_t^T C_t + D x_t; then the gate and RMSNorm in the configured order and grouping."""
    cfg, P = layer.cfg, lambda a: np.asarray(a[...], np.float64)  # noqa: E731
    H, G, N, V = cfg.heads, cfg.groups, layer.d_key, layer.d_value
    x = np.asarray(x, np.float64)
    Bn, T, _ = x.shape
    K = cfg.short_conv

    def conv(inputs, c):
        padded = np.concatenate([np.zeros((Bn, K - 1, inputs.shape[-1])), inputs], 1)
        out = sum(P(c.kernel)[K - 1 - i] * padded[:, K - 1 - i:K - 1 - i + T] for i in range(K))
        return silu(out + (P(c.bias) if cfg.conv_bias else 0))

    C = conv(x @ P(layer.q.kernel), layer.conv_q).reshape(Bn, T, G, N)
    Bk = conv(x @ P(layer.k.kernel), layer.conv_k).reshape(Bn, T, G, N)
    xs = conv(x @ P(layer.v.kernel), layer.conv_v).reshape(Bn, T, H, V)
    dt = np.log1p(np.exp(x @ P(layer.dt.kernel) + P(layer.dt_bias)))  # softplus [Bn, T, H]
    a = np.exp(-np.exp(P(layer.A_log)) * dt)
    y = np.zeros((Bn, T, H, V))
    for b in range(Bn):
        for h in range(H):
            g, state = h // (H // G), np.zeros((N, V))
            for t in range(T):
                state = a[b, t, h] * state + dt[b, t, h] * np.outer(Bk[b, t, g], xs[b, t, h])
                y[b, t, h] = state.T @ C[b, t, g] + P(layer.D)[h] * xs[b, t, h]
    z = silu(x @ P(layer.gate.kernel)).reshape(Bn, T, H, V)
    if cfg.gate_before_norm:
        y = y * z
    scale = P(layer.norm.scale)
    y = (rms_norm(y.reshape(Bn, T, H * V), scale).reshape(y.shape) if cfg.output_norm_over == "width"
         else rms_norm(y, scale))
    if not cfg.gate_before_norm:
        y = y * z
    return y.reshape(Bn, T, H * V) @ P(layer.out.kernel)


def mamba2(form="chunked", chunk=64, **knobs):
    cfg = FastWeightConfig(run=FastWeightRun(form, chunk=chunk), **{**MAMBA2, **knobs})
    layer = FastWeight(cfg, 16, rope=False, rngs=nnx.Rngs(0))
    if "conv_bias" in knobs and knobs["conv_bias"]:  # zero at initialisation: give it values to test
        for i, c in enumerate((layer.conv_q, layer.conv_k, layer.conv_v)):
            c.bias[...] = 0.3 * jax.random.normal(jax.random.key(10 + i), c.bias[...].shape)
    return layer


@pytest.mark.parametrize("knobs", quick_only([
    pytest.param(REFERENCE, id="reference"), pytest.param(BEFORE, id="before"),
    pytest.param(dict(qk_groups=2, output_norm_over="head", gate_before_norm=True), id="two-groups-gate-first"),
    pytest.param(dict(qk_groups=4, conv_bias=True, output_norm_over="width"), id="per-head-groups-width-norm")],
    {"reference", "before"}))  # the quick subset: the layer and the one before it
def test_the_layer_equals_its_written_out_definition_in_both_forms(knobs):
    x = jax.random.normal(jax.random.key(1), (2, 9, 16))
    want = definition(mamba2(**knobs), x)
    with jax.default_matmul_precision("highest"):
        for form in ("chunked", "recurrent"):
            layer = mamba2(form, chunk=4, **knobs)
            got = jax.jit(lambda m, x: m(x)[0])(layer, x)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=form)


def test_the_default_row_is_the_reference_and_the_old_layer_is_a_setting(tiny_cfg):
    cfg, _ = tiny_cfg("mixer=mamba2", "mixer.heads=4")
    assert {k: getattr(cfg.mixer, k) for k in REFERENCE} == REFERENCE
    before, _ = tiny_cfg("mixer=mamba2", "mixer.heads=4", *(f"mixer.{k}={'null' if v is None else v}".lower()
                                                            for k, v in BEFORE.items()))
    assert {k: getattr(before.mixer, k) for k in BEFORE} == BEFORE


def test_one_group_of_b_and_c_is_as_wide_as_the_model_and_the_values_half_of_it():
    """Width 16, 4 heads: the one group of B and C every head shares takes the whole width (d_state 16, where a
    head with its own has its share, 4), the values half of it (expand 1/2: 2 a head); the state counts them."""
    ref, before = mamba2(**REFERENCE), mamba2(**BEFORE)
    assert (ref.d_key, ref.d_value, before.d_key, before.d_value) == (16, 2, 4, 4)
    assert ref.q.kernel.shape == ref.k.kernel.shape == (16, 16) and ref.v.kernel.shape == (16, 8)
    K = 4
    cfg = dataclasses.replace(FastWeightConfig(**MAMBA2), **REFERENCE)
    assert cfg.state_size(16, 9) == 4 * 16 * 2 + (K - 1) * (2 * 16 + 8)  # the memory, then the conv's window


def test_the_rows_wide_state_keeps_the_parameters_of_its_narrow_one(tiny_cfg):
    """At the default job's width, 64 with 4 heads, the row's shape (B and C 64 wide, values 8 a head) holds twice
    the state of B and C 16 wide with values 16 a head, in 2% more parameters a layer (0.9% of the model)."""
    row = tiny_cfg("mixer=mamba2", "model.width=64", "mixer.heads=4")[0].mixer
    narrow = dataclasses.replace(row, key_width=16, expand=1.0)
    layers = [FastWeight(c, 64, rope=False, rngs=nnx.Rngs(0)) for c in (row, narrow)]
    wide, old = (sum(p.size for p in jax.tree.leaves(nnx.state(layer, nnx.Param))) for layer in layers)
    assert 1 < wide / old < 1.02
    memory = [c.heads * c.widths(64)[1] * c.widths(64)[2] for c in (row, narrow)]
    assert memory == [4 * 64 * 8, 4 * 16 * 16]


def test_qk_groups_must_divide_the_heads_and_the_heads_the_values(tiny_cfg):
    from tmem.config import ConfigError

    with pytest.raises(ConfigError, match="mixer.qk_groups=3 must divide mixer.heads=4"):
        tiny_cfg("mixer=mamba2", "mixer.heads=4", "mixer.qk_groups=3")
    with pytest.raises(ConfigError, match="mixer.output_norm_over='group' is not one of: head, width"):
        tiny_cfg("mixer=mamba2", "mixer.output_norm_over=group")
    with pytest.raises(ConfigError, match="mixer.heads=2 must divide mixer.expand x model.width=5"):
        tiny_cfg("mixer=mamba2", "mixer.expand=0.3125")
    with pytest.raises(ConfigError, match="mixer.expand=0.0 must be positive"):
        tiny_cfg("mixer=mamba2", "mixer.expand=0")
    rounded = FastWeightConfig(expand=0.1, heads=3)  # 0.1 x 30 is 3.0000000000000004 in floats: three values
    rounded.check(30)
    assert rounded.widths(30)[2] == 1


def test_a_range_draws_each_heads_a_within_it():
    """A = exp(A_log) uniform in mixer.a_range: the reference's (1, 16) by default, Mamba-2's row (0.1, 1)."""
    for a_range in ((1.0, 16.0), (0.1, 1.0)):
        layer = FastWeight(FastWeightConfig(**MAMBA2, a_range=a_range), 16, rope=False, rngs=nnx.Rngs(0))
        A = np.exp(np.asarray(layer.A_log[...]))
        assert A.shape == (4,) and np.all((A >= a_range[0]) & (A <= a_range[1]))
    with pytest.raises(ValueError, match=r"mixer.a_range=\[0.1, 1.0\] needs decay=scalar"):
        FastWeightConfig(a_range=(0.1, 1.0)).check(16)
