"""The options of mixer=softmax (tmem/mixers/attention.py) and model.norm_position, each against a plain definition.

`reference` writes the layer out in numpy, one example, head and query at a
time: the keys the query sees, its logits and their length factor, the sink,
the softmax and the gate. Options with a state are also read in two calls
that must equal one.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import quick_only
from tmem.backbone import Block
from tmem.config import ConfigError
from tmem.memory.softmax import logn_scale, softmax_read
from tmem.mixers.attention import SoftmaxAttention, SoftmaxConfig
from tmem.mixers.fast_weight import FastWeight, FastWeightConfig, FastWeightRun
from tmem.model import build_model, count_params
from tmem.mlps import DenseConfig

B, T, D, H = 2, 10, 16, 4
d = D // H
L = 4  # the training length of the length scales here: queries past it see more keys than training did


def layer(rope: bool = False, seed: int = 0, **options) -> SoftmaxAttention:
    """A layer with these options and, where the option has parameters that start at a neutral value, random ones."""
    cfg = SoftmaxConfig(heads=H, **options)
    cfg.check(D)
    m = SoftmaxAttention(cfg, D, rope=rope, rngs=nnx.Rngs(params=seed))
    draws = iter(jax.random.split(jax.random.key(seed + 100), 4))
    for name in ("sinks", "ssmax_scale"):
        if hasattr(m, name):
            getattr(m, name)[...] = jax.random.uniform(next(draws), (H,), minval=0.2, maxval=1.5)
    if hasattr(m, "q_norm"):
        m.q_norm.scale[...] = jax.random.uniform(next(draws), (d,), minval=0.5, maxval=2.0)
        m.k_norm.scale[...] = jax.random.uniform(next(draws), (d,), minval=0.5, maxval=2.0)
    return m


def inputs(length: int = T, seed: int = 1) -> jax.Array:
    return jax.random.normal(jax.random.key(seed), (B, length, D))


def _np(p) -> np.ndarray:
    return np.asarray(p[...], np.float64)


def reference(m: SoftmaxAttention, x) -> np.ndarray:
    """The layer's output [B, T, D], written out (no RoPE, no bias, no state)."""
    cfg, x = m.cfg, np.asarray(x, np.float64)
    G, E, n_tokens = m.kv_heads, m.kv_heads * d, x.shape[1]
    W = _np(m.qkv.kernel)
    q = (x @ W[:, :D]).reshape(B, n_tokens, H, d)
    k = (x @ W[:, D:D + E]).reshape(B, n_tokens, G, d)
    v = (x @ W[:, D + E:]).reshape(B, n_tokens, G, d)
    if cfg.qk_norm == "rms":
        q = q / np.sqrt(np.mean(q**2, -1, keepdims=True) + 1e-6) * _np(m.q_norm.scale)
        k = k / np.sqrt(np.mean(k**2, -1, keepdims=True) + 1e-6) * _np(m.k_norm.scale)
    elif cfg.qk_norm == "l2":
        q, k = q / np.linalg.norm(q, axis=-1, keepdims=True), k / np.linalg.norm(k, axis=-1, keepdims=True)
    beta = cfg.temperature if cfg.temperature is not None else math.sqrt(d) if cfg.qk_norm == "l2" else 1 / math.sqrt(d)
    o = np.zeros((B, n_tokens, H, d))
    for b in range(B):
        for h in range(H):
            g = h // (H // G)  # query head h reads the key-value head of its group
            for t in range(n_tokens):
                seen = [s for s in range(t + 1) if cfg.window is None or s > t - cfg.window]
                n = len(seen)
                factor = 1.0
                if cfg.length_scale == "logn":
                    factor = max(1.0, math.log(n) / math.log(cfg.train_length))
                elif cfg.length_scale == "ssmax":
                    factor = _np(m.ssmax_scale)[h] * math.log(n)
                logits = [beta * factor * q[b, t, h] @ k[b, s, g] for s in seen]
                if cfg.sinks:
                    logits.append(_np(m.sinks)[h])
                e = np.exp(np.array(logits) - max(logits))
                w = e / e.sum()
                o[b, t, h] = sum(w[i] * v[b, s, g] for i, s in enumerate(seen))  # the sink's weight reads nothing
    if cfg.output_gate:
        a = x @ _np(m.gate.kernel)
        o = o * (a / (1 + np.exp(-a)) if cfg.gate_activation == "silu" else 1 / (1 + np.exp(-a))).reshape(o.shape)
    return o.reshape(B, n_tokens, D) @ _np(m.out.kernel)


OPTIONS = {
    "plain": {},
    "mqa": dict(kv_heads=1),
    "gqa": dict(kv_heads=2),
    "window": dict(window=3),
    "uniform": dict(temperature=0.0),  # beta = 0 reads the mean of the visible values, not the default beta
    "logn": dict(length_scale="logn", train_length=L),
    "ssmax": dict(length_scale="ssmax", train_length=L),
    "sinks": dict(sinks=True),
    "gate-sigmoid": dict(output_gate=True),
    "gate-silu": dict(output_gate=True, gate_activation="silu"),
    "qk-rms": dict(qk_norm="rms"),
    "qk-l2": dict(qk_norm="l2"),
    "all": dict(kv_heads=2, window=4, length_scale="ssmax", train_length=L, sinks=True, output_gate=True,
                qk_norm="rms"),
}


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_each_option_equals_its_written_out_definition(name):
    m = layer(**OPTIONS[name])
    x = inputs()
    y, _ = m(x)
    np.testing.assert_allclose(np.asarray(y), reference(m, x), rtol=1e-4, atol=1e-5)


def test_grouped_queries_equal_multi_head_attention_with_the_kv_heads_repeated():
    gqa, mha = layer(kv_heads=2), layer()
    W, E, r = gqa.qkv.kernel[...], 2 * d, H // 2
    repeat = lambda w: jnp.repeat(w.reshape(D, 2, d), r, axis=1).reshape(D, D)  # noqa: E731  kv head j -> heads jr..
    mha.qkv.kernel[...] = jnp.concatenate([W[:, :D], repeat(W[:, D:D + E]), repeat(W[:, D + E:])], axis=1)
    mha.out.kernel[...] = gqa.out.kernel[...]
    x = inputs()
    (y_gqa, cache), (y_mha, _) = gqa(x), mha(x)
    np.testing.assert_allclose(y_gqa, y_mha, rtol=1e-5, atol=1e-6)
    assert cache.keys.shape == cache.values.shape == (B, T, 2, d)  # the cache holds the kv heads only
    assert count_params(mha) - count_params(gqa) == 2 * D * (H - 2) * d


def test_the_read_with_a_sink_is_softmax_over_the_logits_and_the_sink_with_its_column_dropped():
    q, k, v = (jax.random.normal(key, (1, 5, 2, 3)) for key in jax.random.split(jax.random.key(0), 3))
    sink = jnp.array([0.5, -1.0])
    mask = jnp.tril(jnp.ones((5, 5), bool)).reshape(1, 1, 5, 5)
    o, w = softmax_read(q, k, v, mask, 0.7, sink_h=sink)
    logits = np.where(np.asarray(mask), 0.7 * np.einsum("bthd,bshd->bhts", q, k), -np.inf)
    with_sink = np.concatenate([logits, np.broadcast_to(np.asarray(sink).reshape(1, 2, 1, 1), (1, 2, 5, 1))], -1)
    expected = np.exp(with_sink - with_sink.max(-1, keepdims=True))
    expected = (expected / expected.sum(-1, keepdims=True))[..., :5]
    np.testing.assert_allclose(w, expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(o, np.einsum("bhts,bshd->bthd", expected, v), rtol=1e-5, atol=1e-6)
    assert float(w.sum(-1).max()) < 1  # the sink took some of every row's weight


def test_the_length_factors_follow_their_formulas():
    n = jnp.arange(1, 13)
    np.testing.assert_allclose(logn_scale(n, 8), np.maximum(np.log(np.arange(1, 13)) / np.log(8), 1.0), rtol=1e-6)
    assert np.all(np.asarray(logn_scale(n[:8], 8)) == 1.0)  # nothing changes up to the training length
    # Scalable-Softmax starts as plain softmax at the training length: s log L = 1
    s = SoftmaxAttention(SoftmaxConfig(heads=H, length_scale="ssmax", train_length=64), D, rope=False,
                         rngs=nnx.Rngs(params=0)).ssmax_scale[...]
    np.testing.assert_allclose(s * math.log(64), 1.0, rtol=1e-6)


def _split_calls(m, x, splits, read_at=None):
    """Outputs of calls over consecutive pieces of x, each continuing the last one's state; and the states."""
    outs, states, state = [], [], None
    for a, b in zip((0, *splits), (*splits, x.shape[1])):
        y, state = m(x[:, a:b], state=state)
        outs.append(y)
        states.append(state)
    return jnp.concatenate(outs, 1), states


# all: kv heads, window, ssmax, sinks, gate, rms (the quick subset's case); window and logn alone in the full suite
@pytest.mark.parametrize("name", quick_only(["window", "logn", "all"], {"all"}))
def test_two_calls_equal_one_wherever_the_split(name):
    m, x = layer(rope=True, **OPTIONS[name]), inputs()
    full, _ = m(x)
    call = nnx.jit(lambda m, x, state=None: m(x, state=state))  # jitted: op by op, the case with every option took 9 s
    for split in (1, 3, 7):  # before, at and after the window's length and the training length
        two, (first, last) = _split_calls(lambda y, state: call(m, y, state), x, (split,))
        np.testing.assert_allclose(two, full, rtol=1e-5, atol=1e-5, err_msg=f"split at {split}")
        assert (first.length, last.length) == (split, T)
        if m.cfg.window is not None:  # only the keys a later query can see are kept
            assert first.keys.shape[1] == min(split, m.cfg.window - 1)
            assert last.keys.shape[1] == m.cfg.window - 1


@pytest.mark.slow  # 3 s: a continuation many times the window long
def test_a_long_windowed_continuation_keeps_a_bounded_cache():
    m, x = layer(rope=True, window=3, kv_heads=2), inputs(length=24)
    full, _ = m(x)
    pieces, states = _split_calls(m, x, tuple(range(1, 24, 2)))  # a token, then two at a time
    np.testing.assert_allclose(pieces, full, rtol=1e-5, atol=1e-5)
    assert max(s.keys.shape[1] for s in states) == 2 and states[-1].length == 24
    assert SoftmaxConfig(window=3).state_size(D, 1000) == 2 * D * 2 == SoftmaxConfig().state_size(D, 2)


def test_post_norm_is_the_norm_of_the_residual_sum():
    block = Block(D, norm="layernorm", mixer=SoftmaxConfig(heads=H), mlp=DenseConfig("relu"), positions="none",
                  rngs=nnx.Rngs(params=0), post_norm=True)
    x = inputs()
    h = block.mixer_norm(x + block.mixer(x)[0])
    expected = block.mlp_norm(h + block.mlp(h))
    np.testing.assert_allclose(block(x)[0], expected, rtol=1e-6, atol=1e-6)


@pytest.mark.slow  # 13 s; the quick subset continues softmax's states in test_two_calls_equal_one_wherever_the_split
def test_a_post_norm_model_has_no_final_norm_and_continues_from_its_states(tiny_cfg):
    cfg, _ = tiny_cfg("model.norm_position=post", "mixer.window=5")
    model = build_model(cfg, cfg.task)
    assert "norm" in nnx.to_pure_dict(nnx.state(build_model(tiny_cfg()[0], cfg.task), nnx.Param))
    assert "norm" not in nnx.to_pure_dict(nnx.state(model, nnx.Param))
    tokens = cfg.task.sample(jax.random.key(3), 2).inputs
    full, _ = model.forward(tokens)
    outs, states = [], None
    for a, b in ((0, 7), (7, tokens.shape[1])):
        out, states = model.forward(tokens[:, a:b], states=states)
        outs.append(out)
    np.testing.assert_allclose(jnp.concatenate(outs, 1), full, rtol=1e-5, atol=1e-5)


def test_two_windowed_layers_see_the_last_2_window_minus_1_tokens(tiny_cfg):
    """README's bound for mixer.window=16 on the default job: after two layers a position's output depends on
    the 2 (window - 1) tokens before it and on none earlier, whatever the weights."""
    cfg, _ = tiny_cfg("mixer.window=4", "model.depth=2")
    model = build_model(cfg, cfg.task)
    tokens = cfg.task.sample(jax.random.key(3), 1).inputs
    t, reach = tokens.shape[1] - 1, 2 * (4 - 1)
    base, _ = model.forward(tokens)
    changed = lambda s: model.forward(tokens.at[0, s].set((tokens[0, s] + 1) % cfg.task.vocab))[0]  # noqa: E731
    assert not np.allclose(changed(t - reach)[0, t], base[0, t])
    np.testing.assert_array_equal(changed(t - reach - 1)[0, t], base[0, t])


def test_fast_weight_rows_accept_rms_qk_norm():
    """Linear attention with RMS-normed q and k: o_t = sum_{s <= t} (q_t . k_s) v_s / sqrt(d), written out."""
    cfg = FastWeightConfig(heads=2, qk_norm="rms", short_conv=0, output_norm=False,
                           run=FastWeightRun("recurrent"))
    cfg.check(D)
    m = FastWeight(cfg, D, rope=False, rngs=nnx.Rngs(params=0))
    m.q_norm.scale[...] = jnp.linspace(0.5, 2.0, D // 2)
    x = inputs()
    y, _ = m(x)
    xs = np.asarray(x, np.float64)
    rms = lambda z, gain: z / np.sqrt(np.mean(z**2, -1, keepdims=True) + 1e-6) * gain  # noqa: E731
    q = rms((xs @ _np(m.q.kernel)).reshape(B, T, 2, -1), _np(m.q_norm.scale))
    k = rms((xs @ _np(m.k.kernel)).reshape(B, T, 2, -1), _np(m.k_norm.scale))
    v = (xs @ _np(m.v.kernel)).reshape(B, T, 2, -1)
    scores = np.tril(np.ones((T, T))).reshape(1, 1, T, T) * np.einsum("bthd,bshd->bhts", q, k) / math.sqrt(D // 2)
    expected = np.einsum("bhts,bshd->bthd", scores, v).reshape(B, T, D) @ _np(m.out.kernel)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)
    assert not hasattr(FastWeight(FastWeightConfig(), D, rope=False, rngs=nnx.Rngs(params=0)), "q_norm")


def test_a_zero_temperature_is_kept_in_both_softmax_rows(tiny_cfg):
    assert tiny_cfg("mixer.temperature=0")[0].mixer.temperature == 0  # read as beta = 0, not the default (above)
    assert tiny_cfg("mixer=hopfield", "mixer.temperature=0")[0].mixer.temperature == 0


def test_the_training_length_is_the_tasks_unless_set(tiny_cfg):
    assert tiny_cfg("mixer.length_scale=logn")[0].mixer.train_length == 16
    assert tiny_cfg("mixer.length_scale=logn", "mixer.train_length=64")[0].mixer.train_length == 64


@pytest.mark.parametrize("overrides, message", [
    (["mixer.kv_heads=3"], "mixer.kv_heads=3 must divide mixer.heads=2"),
    (["mixer.window=0"], "mixer.window=0 must be positive or null"),
    (["mixer.length_scale=log"], "mixer.length_scale='log' is not one of: none, logn, ssmax"),
    (["mixer.length_scale=logn", "mixer.train_length=1"], "mixer.train_length=1 must be at least 2"),
    (["mixer.gate_activation=relu"], "mixer.gate_activation='relu' is not one of: silu, sigmoid"),
    (["mixer.qk_norm=true"], "mixer.qk_norm='True' is not one of: none, rms, l2 .it was a bool: true is rms"),
    (["model.norm_position=middle"], "model.norm_position='middle' is not one of: pre, post"),
    (["mixer=linear", "mixer.qk_norm=layer"], "mixer.qk_norm='layer' is not one of: none, rms, l2"),
    (["mixer=deltanet", "mixer.qk_norm=rms"], "mixer.qk_norm must be l2 with rule=delta"),
    # one rule for beta in both softmax rows (tmem.mixers.base.check_temperature)
    (["mixer.temperature=-1"], "mixer.temperature=-1.0 must be positive, zero .* or null"),
    (["mixer=hopfield", "mixer.temperature=-1"], "mixer.temperature=-1.0 must be positive, zero .* or null"),
    (["mixer=hopfield", "mixer.temperature=0", "mixer.learn_temperature=true"],
     "mixer.temperature=0.0 must be positive, zero .*not with mixer.learn_temperature"),
])
def test_bad_options_fail_in_one_line(tiny_cfg, overrides, message):
    with pytest.raises(ConfigError, match=message) as error:
        tiny_cfg(*overrides)
    assert "\n" not in str(error.value)
