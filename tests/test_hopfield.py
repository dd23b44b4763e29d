"""The Hopfield row: its read against Derivations D8 and D19, and the layer on the mixer protocol."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tmem.memory import softmax_read
from tmem.memory.hopfield import hopfield_read, hopfield_update
from tmem.mixers.hopfield import Hopfield, HopfieldConfig, converge

HIGHEST = jax.lax.Precision.HIGHEST


def one_query(xi_d, patterns_md):
    """A cue [d] and patterns [M, d] as the read's shapes: one example, one query, one head."""
    return xi_d.reshape(1, 1, 1, -1), patterns_md.reshape(1, -1, 1, patterns_md.shape[-1])


def test_iterated_to_a_tolerance_the_read_is_a_fixed_point():
    """D8: the stationary points of the energy are the xi with xi = X^T softmax(beta X xi)."""
    X = jax.random.normal(jax.random.key(0), (12, 8))
    xi0 = jax.random.normal(jax.random.key(1), (8,))
    xi, _, n = hopfield_read(*one_query(xi0, X), True, 0.5, iterations=500, tolerance=1e-7)
    xi = xi.reshape(-1)
    with jax.default_matmul_precision("highest"):
        residual = xi - X.T @ jax.nn.softmax(0.5 * X @ xi)
    assert 1 < int(n) < 500  # it stopped by converging, after more than one update
    assert np.abs(residual).max() < 1e-5
    assert np.abs(xi - xi0).max() > 0.1  # and it moved: the cue was not already a fixed point


def test_a_large_beta_returns_the_pattern_of_largest_inner_product_not_the_nearest():
    """beta -> infinity: the softmax becomes an argmax of x_s . xi, which favours long patterns; the nearest
    pattern wins only when all have the same norm."""
    X = jnp.array([[1.0, 0.0], [3.0, 3.0], [-2.0, 1.0]])
    cue = jnp.array([1.0, 0.1])
    nearest, largest = int(jnp.argmin(jnp.linalg.norm(X - cue.reshape(1, 2), axis=1))), int(jnp.argmax(X @ cue))
    assert (nearest, largest) == (0, 1)  # the two differ here
    xi, _, _ = hopfield_read(*one_query(cue, X), True, 200.0)
    np.testing.assert_allclose(xi.reshape(-1), X[largest], atol=1e-6)
    unit = X / jnp.linalg.norm(X, axis=1, keepdims=True)
    xi, _, _ = hopfield_read(*one_query(cue, unit), True, 200.0)
    np.testing.assert_allclose(xi.reshape(-1), unit[nearest], atol=1e-6)  # equal norms: the nearest


def test_beta_zero_returns_the_mean_of_the_patterns_the_mask_allows():
    X = jax.random.normal(jax.random.key(2), (1, 6, 2, 4))
    xi = jax.random.normal(jax.random.key(3), (1, 6, 2, 4))
    causal = jnp.tril(jnp.ones((6, 6), bool))[None, None]
    out, weights, _ = hopfield_read(xi, X, causal, 0.0, iterations=3)
    means = jnp.cumsum(X, axis=1) / jnp.arange(1, 7).reshape(1, 6, 1, 1)  # query t: the mean of patterns 0..t
    np.testing.assert_allclose(out, means, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)


def test_with_unit_keys_softmax_attention_is_a_gaussian_kernel_smoother():
    """D19: exp(beta q . k) is exp(-beta |q - k|^2 / 2) times factors that cancel when |k| = 1, so the read is
    Nadaraya-Watson with a Gaussian kernel of bandwidth sigma = 1/sqrt(beta); with longer keys it is not."""
    M, d, beta = 10, 6, 2.5
    k = jax.random.normal(jax.random.key(4), (M, d))
    unit = k / jnp.linalg.norm(k, axis=1, keepdims=True)
    v = jax.random.normal(jax.random.key(5), (M, 3))
    q = 1.7 * jax.random.normal(jax.random.key(6), (d,))  # the query need not be a unit vector
    sigma = beta ** -0.5

    def smoother(keys):
        kernel = jnp.exp(-jnp.sum((q.reshape(1, d) - keys) ** 2, axis=1) / (2 * sigma ** 2))
        return kernel @ v / kernel.sum()

    def attention(keys):
        with jax.default_matmul_precision("highest"):
            o, _ = softmax_read(q.reshape(1, 1, 1, d), keys.reshape(1, M, 1, d), v.reshape(1, M, 1, 3), True, beta)
        return o.reshape(-1)

    np.testing.assert_allclose(attention(unit), smoother(unit), rtol=1e-5, atol=1e-6)
    assert not np.allclose(attention(k), smoother(k), atol=1e-2)
    # the Hopfield update is the same read with the patterns as values: the smoother of the patterns themselves
    xi, _ = hopfield_update(*one_query(q, unit), True, beta)
    kernel = jnp.exp(-jnp.sum((q.reshape(1, d) - unit) ** 2, axis=1) / (2 * sigma ** 2))
    np.testing.assert_allclose(xi.reshape(-1), kernel @ unit / kernel.sum(), rtol=1e-5, atol=1e-6)


def layer(**knobs):
    return Hopfield(HopfieldConfig(heads=2, **knobs), 16, rope=False, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("knobs", [dict(), dict(iterations=3, learn_temperature=True, temperature=0.5)])
def test_the_layer_continues_from_its_state_and_reads_at_positions(knobs):
    mixer = layer(**knobs)
    x = jax.random.normal(jax.random.key(7), (2, 11, 16))
    read_at = jnp.array([[0, 6, 10], [3, 3, 9]])

    @jax.jit
    def reads(mixer, x):
        whole, state = mixer(x)
        first, prefix = mixer(x[:, :6])
        second, after = mixer(x[:, 6:], state=prefix)
        picked, _ = mixer(x, read_at=read_at)
        return whole, jnp.concatenate([first, second], 1), picked, state.patterns, after.patterns, after.length

    whole, continued, picked, patterns, continued_patterns, length = reads(mixer, x)
    np.testing.assert_allclose(continued, whole, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(continued_patterns, patterns, rtol=1e-6)
    assert length == 11
    np.testing.assert_allclose(picked, jnp.take_along_axis(whole, read_at[..., None], 1), rtol=1e-5, atol=1e-6)


def test_the_layer_is_causal_and_one_update_is_attention_with_values_tied_to_keys():
    mixer = layer()
    x = jax.random.normal(jax.random.key(8), (2, 9, 16))
    changed = x.at[:, 5:].add(1.0)
    a, b = (jax.jit(lambda m, x: m(x)[0])(mixer, y) for y in (x, changed))
    np.testing.assert_allclose(a[:, :5], b[:, :5], rtol=1e-6, atol=1e-6)
    assert not np.allclose(a[:, 5:], b[:, 5:])
    X = (x @ mixer.patterns.kernel[...]).reshape(2, 9, 2, 8)
    xi = (x @ mixer.cue.kernel[...]).reshape(2, 9, 2, 8)
    causal = jnp.tril(jnp.ones((9, 9), bool))[None, None]
    o, _ = softmax_read(xi, X, X, causal, 8 ** -0.5)
    np.testing.assert_allclose(a, mixer.out(o.reshape(2, 9, 16)), rtol=1e-5, atol=1e-6)


def test_converging_a_built_layer_iterates_to_the_tolerance_for_evaluation_only():
    """Evaluation turns the tolerance on in a built model; the while loop it runs has no reverse-mode gradient,
    which is why it is not a config field (a training run cannot ask for it)."""
    mixer = layer(iterations=2, temperature=2.0)
    x = jax.random.normal(jax.random.key(9), (1, 7, 16))
    fixed = jax.jit(lambda m, x: m(x)[0])(mixer, x)
    assert converge(mixer, 1e-6, max_iterations=200) == 1
    converged = jax.jit(lambda m, x: m(x)[0])(mixer, x)
    assert not np.allclose(converged, fixed, atol=1e-4)
    assert "tolerance" not in HopfieldConfig.__dataclass_fields__
    with pytest.raises(ValueError, match="Reverse-mode differentiation does not work for lax.while_loop"):
        jax.grad(lambda x: mixer(x)[0].sum())(x)
    converge(mixer, None)
    np.testing.assert_allclose(jax.jit(lambda m, x: m(x)[0])(mixer, x), fixed, rtol=1e-6)
