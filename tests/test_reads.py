"""Reads: score functions recall orthonormal keys exactly; the exponential read is softmax_read."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tmem.memory.reads import SCORES, exp_read, linear_read, relu_power, score_read, score_weights


def orthonormal(M, d, seed=0):
    q, _ = jnp.linalg.qr(jax.random.normal(jax.random.key(seed), (d, d)))
    return q[:M]


@pytest.mark.parametrize("score", ["linear", "relu", "relu2", "relu3"])
def test_score_reads_recall_orthonormal_keys_exactly(score):
    K, V = orthonormal(6, 8), jax.random.normal(jax.random.key(1), (6, 3))
    np.testing.assert_allclose(score_read(K, V, K, score), V, atol=1e-5)


def test_relu_powers_keep_a_full_match_and_shrink_small_ones():
    s = jnp.array([-0.5, 0.1, 1.0])
    for p in (1, 2, 3):
        np.testing.assert_allclose(relu_power(p)(s), [0.0, 0.1**p, 1.0], rtol=1e-6)
    np.testing.assert_allclose(SCORES["swish_gate"](s), jax.nn.silu(s) * s, rtol=1e-6)


def test_score_read_is_the_weighted_sum_of_values():
    K, V = jax.random.normal(jax.random.key(0), (5, 4)), jax.random.normal(jax.random.key(1), (5, 3))
    q = jax.random.normal(jax.random.key(2), (2, 4))
    w = score_weights(K, q, "relu2")
    np.testing.assert_allclose(w, jnp.maximum(q @ K.T, 0) ** 2, rtol=1e-5)
    np.testing.assert_allclose(score_read(K, V, q, "relu2"), w @ V, rtol=1e-5)
    np.testing.assert_allclose(linear_read(K.T @ V, q), q @ K.T @ V, rtol=1e-5)


def test_exponential_read_is_a_softmax_over_scaled_matches():
    K, V = jax.random.normal(jax.random.key(0), (7, 4)), jax.random.normal(jax.random.key(1), (7, 3))
    q = jax.random.normal(jax.random.key(2), (2, 4))
    o, w = exp_read(K, V, q, 2.5)
    expected = jax.nn.softmax(2.5 * q @ K.T, axis=-1)
    np.testing.assert_allclose(w, expected, rtol=1e-5)
    np.testing.assert_allclose(o, expected @ V, rtol=1e-5)
    # a large beta turns it into the hard lookup of the best match
    o_hard, _ = exp_read(K, V, K[:3], 200.0)
    best = jnp.argmax(K[:3] @ K.T, axis=-1)
    np.testing.assert_allclose(o_hard, V[best], atol=1e-4)
