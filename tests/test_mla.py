"""Multi-head latent attention (tmem/mixers/mla.py): the layer against a written-out definition, against plain
multi-head softmax attention with the same effective W_K and W_V, the absorbed form against the naive one in
values and gradients, and its cache as what the state size counts."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import compose_config
from tmem.config import ConfigError, validate
from tmem.layers import rope
from tmem.mixers.attention import SoftmaxAttention, SoftmaxConfig
from tmem.mixers.mla import MLA, MLAConfig, MLARun

WIDTH, HEADS = 16, 2
D_HEAD = WIDTH // HEADS
SMALL = MLAConfig(heads=HEADS, latent=6, q_latent=5, rope_dim=4)


def layer(cfg: MLAConfig = SMALL, seed: int = 0) -> MLA:
    """An MLA whose every weight (the norms' gains too) is drawn at random, so no part reads as the identity."""
    m = MLA(cfg, WIDTH, rope=True, rngs=nnx.Rngs(seed))
    params = nnx.state(m, nnx.Param)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed + 100), len(leaves))
    nnx.update(m, jax.tree.unflatten(tree, [0.5 * jax.random.normal(k, x.shape) + (x.ndim == 1)
                                           for k, x in zip(keys, leaves)]))
    return m


def tokens(B=2, T=7, seed=1):
    return jax.random.normal(jax.random.key(seed), (B, T, WIDTH))


def definition(m: MLA, x) -> np.ndarray:
    """The module docstring's equations token by token in float64 (the rotations by tmem.layers.rope): head h at
    t reads softmax_s(beta [q^C ; RoPE(q^R)] . [W_UK,h c_s ; k^R_s]) over s <= t of W_UV,h c_s."""
    cfg, (B, T, D) = m.cfg, x.shape
    H, d, L, dr = cfg.heads, D // cfg.heads, cfg.latent, cfg.rope_dim
    f64 = lambda a: np.asarray(a, np.float64)
    rms = lambda z, g: z / np.sqrt(np.mean(z * z, -1, keepdims=True) + 1e-6) * g
    down = f64(x) @ f64(m.kv_down.kernel[...])
    c = rms(down[..., :L], f64(m.kv_norm.scale[...]))
    k_r = f64(rope(jnp.asarray(down[..., None, L:], jnp.float32), jnp.arange(T)))[:, :, 0]
    q = rms(f64(x) @ f64(m.q_down.kernel[...]), f64(m.q_norm.scale[...])) @ f64(m.q_up.kernel[...])
    q_c, q_r = q[..., :H * d].reshape(B, T, H, d), q[..., H * d:].reshape(B, T, H, dr)
    q_r = f64(rope(jnp.asarray(q_r, jnp.float32), jnp.arange(T)))
    up = f64(m.kv_up.kernel[...])
    o = np.zeros((B, T, H, d))
    for b in range(B):
        for h in range(H):
            w_uk, w_uv = up[:, h * d:(h + 1) * d], up[:, D + h * d:D + (h + 1) * d]
            for t in range(T):
                logits = np.array([cfg.beta(D) * (q_c[b, t, h] @ (c[b, s] @ w_uk) + q_r[b, t, h] @ k_r[b, s])
                                   for s in range(t + 1)])
                p = np.exp(logits - logits.max())
                o[b, t, h] = (p / p.sum()) @ (c[b, :t + 1] @ w_uv)
    return o.reshape(B, T, D) @ f64(m.out.kernel[...])


@nnx.jit
def read(m, x):
    return m(x)


@pytest.mark.slow  # the quick subset holds the layer to multi-head attention below; this adds the rotary part
@pytest.mark.parametrize("form", ["naive", "absorbed"])
def test_the_layer_is_its_written_out_definition(form):
    m = layer(dataclasses.replace(SMALL, run=MLARun(form=form)))
    x = tokens()
    np.testing.assert_allclose(read(m, x)[0], definition(m, x), rtol=2e-4, atol=2e-5)


def test_with_no_rotary_query_it_is_multi_head_softmax_attention_with_the_effective_keys_and_values():
    """W_K = W_DKV W_UK and W_V = W_DKV W_UV (no norm on the latents, W_Q = W_DQ W_UQ^C): softmax attention built
    with those weights reads the same, once the rotary queries are zero (they alone carry positions here); and
    those are the maps `circuit_weights` gives the induction probe."""
    cfg = dataclasses.replace(SMALL, latent_norm=False, temperature=D_HEAD ** -0.5)  # softmax's beta
    m = layer(cfg)
    q_up = m.q_up.kernel[...]
    m.q_up.kernel[...] = q_up.at[:, HEADS * D_HEAD:].set(0.0)
    w_dkv, up = m.kv_down.kernel[:, :cfg.latent], m.kv_up.kernel[...]
    plain = SoftmaxAttention(SoftmaxConfig(heads=HEADS), WIDTH, rope=False, rngs=nnx.Rngs(0))
    plain.qkv.kernel[...] = jnp.concatenate([m.q_down.kernel[...] @ q_up[:, :HEADS * D_HEAD], w_dkv @ up], axis=1)
    plain.out.kernel[...] = m.out.kernel[...]
    kernel, kv_heads = m.circuit_weights()  # what the weight-only probes read: these same maps
    np.testing.assert_allclose(kernel, plain.qkv.kernel[...], rtol=1e-6)
    assert kv_heads == HEADS
    x = tokens()
    np.testing.assert_allclose(read(m, x)[0], read(plain, x)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # two gradients compiled: 15 s on the loaded 2 cores
def test_the_absorbed_form_equals_the_naive_in_values_and_gradients_continuing_and_reading_at_positions():
    """From a cache of 4 tokens, 6 more read at 3 chosen positions: the read, the cache handed on, and the
    gradients of every parameter and of the input."""
    naive = layer()
    absorbed = layer(dataclasses.replace(SMALL, run=MLARun(form="absorbed")))
    x = tokens(T=10)
    _, cache = read(naive, x[:, :4])
    read_at = jnp.array([[0, 3, 5], [1, 2, 5]])

    def loss(m, x):
        y, state = m(x, state=cache, read_at=read_at)
        return jnp.sum(jnp.sin(y)), (y, state)

    grad = nnx.jit(nnx.value_and_grad(loss, argnums=(0, 1), has_aux=True))
    (_, (y_n, s_n)), (g_n, gx_n) = grad(naive, x[:, 4:])
    (_, (y_a, s_a)), (g_a, gx_a) = grad(absorbed, x[:, 4:])
    np.testing.assert_allclose(y_a, y_n, rtol=1e-5, atol=1e-6)
    assert s_a.length == s_n.length == 10 and s_a.latent.shape == (2, 10, SMALL.latent)
    np.testing.assert_allclose(s_a.latent, s_n.latent)
    np.testing.assert_allclose(gx_a, gx_n, rtol=1e-4, atol=1e-6)
    for a, n in zip(jax.tree.leaves(nnx.state(g_a)), jax.tree.leaves(nnx.state(g_n))):
        np.testing.assert_allclose(a, n, rtol=1e-4, atol=1e-5)
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(nnx.state(g_n))) > 0


def test_the_cache_is_the_latent_and_rotary_key_the_state_size_counts_and_the_weights_are_causal():
    m = layer()
    x = tokens(T=9)
    (_, cache), inter = nnx.jit(lambda m, x: nnx.capture(m, nnx.Intermediate)(x))(m, x)
    per_example = (cache.latent.size + cache.rope_keys.size) // x.shape[0]
    assert per_example == SMALL.state_size(WIDTH, 9) == 9 * (SMALL.latent + SMALL.rope_dim)
    assert SMALL.state_size(WIDTH, 9) < 2 * WIDTH * 9  # smaller than multi-head attention's keys and values
    (weights,) = inter["attention"]
    assert weights.shape == (2, HEADS, 9, 9)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
    assert float(jnp.abs(jnp.triu(weights, 1)).max()) == 0.0


def test_positions_resolve_to_rope_and_others_are_refused_in_one_line():
    assert validate(compose_config(["mixer=mla"])).model.positions == "rope"
    with pytest.raises(ConfigError, match=r"^model.positions=learned: mixer 'mla' rotates its keys .* use "
                                          r"model.positions=rope \(or auto\)$"):
        validate(compose_config(["mixer=mla", "model.positions=learned"]))
    with pytest.raises(ConfigError, match="mixer.rope_dim=3 must be even"):
        validate(compose_config(["mixer=mla", "mixer.rope_dim=3"]))
