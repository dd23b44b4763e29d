"""Linear self-attention: store and quadratic forms, the two layouts, and Proposition 1 against explicit GD."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tmem.memory.lsa import causal_read, masked_read, prompt_read
from tmem.mixers.lsa import LinearSelfAttention, LSAConfig, construction_weights
from tmem.model import load_weights
from tmem.probes.learners import gd_weights


def qkv(B=2, T=7, H=2, d=3, seed=0):
    return jax.random.normal(jax.random.key(seed), (3, B, T, H, d))


def test_prompt_store_equals_the_masked_quadratic_form():
    q, k, v = qkv()
    o, S = prompt_read(q, k, v, n_context=6)
    mask = (jnp.arange(7) < 6)[None, None, None, :]  # every query reads the first 6 tokens
    np.testing.assert_allclose(o, masked_read(q, k, v, mask), rtol=1e-5, atol=1e-5)
    assert S.shape == (2, 2, 3, 3)


def test_causal_store_equals_the_masked_form_and_continues_from_a_state():
    q, k, v = qkv(T=9)
    o, S = causal_read(q, k, v, jnp.arange(9))
    np.testing.assert_allclose(o, masked_read(q, k, v, jnp.tril(jnp.ones((9, 9), bool))), rtol=1e-5, atol=1e-5)
    first, S1 = causal_read(q[:, :4], k[:, :4], v[:, :4], jnp.arange(4))
    second, S2 = causal_read(q[:, 4:], k[:, 4:], v[:, 4:], jnp.arange(5), S1)
    np.testing.assert_allclose(jnp.concatenate([first, second], 1), o, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(S2, S, rtol=1e-5, atol=1e-5)


def mixer(layout="prompt", width=6, heads=2, **kw):
    cfg = LSAConfig(heads=heads, layout=layout, init_scale=1.0, **kw)
    return cfg, LinearSelfAttention(cfg, width, rope=False, rngs=nnx.Rngs(0))


def test_prompt_layout_never_reads_the_query_token():
    _, m = mixer()
    x = jax.random.normal(jax.random.key(1), (2, 5, 6))
    changed = x.at[:, -1].set(7.0)
    a, _ = m(x)
    b, _ = m(changed)
    np.testing.assert_allclose(a[:, :-1], b[:, :-1], rtol=1e-6)  # contexts read only contexts
    assert not np.allclose(a[:, -1], b[:, -1])  # the query does read, with its own query vector


def test_causal_layout_is_causal_and_read_at_picks_positions():
    _, m = mixer("causal")
    x = jax.random.normal(jax.random.key(1), (2, 6, 6))
    a, _ = m(x)
    b, _ = m(x.at[:, 4:].set(3.0))
    np.testing.assert_allclose(a[:, :4], b[:, :4], rtol=1e-6)
    assert not np.allclose(a[:, 4:], b[:, 4:])
    at = jnp.array([[1, 5], [0, 3]])
    picked, _ = m(x, read_at=at)
    np.testing.assert_allclose(picked, jnp.take_along_axis(a, at[..., None], 1), rtol=1e-5, atol=1e-6)


def test_head_mask_zero_removes_the_layer():
    _, m = mixer()
    x = jax.random.normal(jax.random.key(1), (2, 5, 6))
    y, _ = m(x, head_mask=jnp.zeros(2))
    assert float(jnp.abs(y).max()) == 0.0


def test_construction_is_gradient_descent_from_any_start_with_vector_labels():
    """Proposition 1 (von Oswald T1/T2): each application of the layer is one more GD step from W_0."""
    d, o, N, eta = 5, 3, 12, 0.7
    kx, kw, k0 = jax.random.split(jax.random.key(2), 3)
    x = jax.random.normal(kx, (4, N + 1, d))
    W = jax.random.normal(kw, (4, o, d))
    W0 = 0.3 * jax.random.normal(k0, (o, d))
    y = jnp.einsum("bnd,bod->bno", x, W)
    y = y.at[:, -1].set(-(x[:, -1] @ W0.T))  # the query enters as [x_q, -W_0 x_q]
    cfg, m = mixer(width=d + o, heads=2)
    load_weights(m, construction_weights(cfg, d + o, d, eta / N, w0=W0))
    step = jax.jit(lambda e: e + m(e)[0])
    e = jnp.concatenate([x, y], -1)
    for steps in (1, 2, 3):
        e = step(e)
        for b in range(4):
            W_k = gd_weights(x[b, :N], y[b, :N], [eta] * steps, W0)
            np.testing.assert_allclose(e[b, -1, d:], -(W_k @ x[b, -1]), rtol=1e-4, atol=1e-5)
            # every context label becomes the residual of the stepped model (what the next layer reads)
            np.testing.assert_allclose(e[b, :N, d:], y[b, :N] - x[b, :N] @ (W_k - W0).T, rtol=1e-4, atol=1e-5)
            np.testing.assert_array_equal(e[b, :, :d], x[b])


def test_config_checks_and_state_size():
    with pytest.raises(ValueError, match="mixer.layout='both'"):
        LSAConfig(layout="both").check(8)
    with pytest.raises(ValueError, match="mixer.heads=0"):
        LSAConfig(heads=0).check(8)
    assert LSAConfig(heads=2).state_size(11, 100) == 2 * 11 * 11
    assert LSAConfig().state_size_per_token(11) is None
