"""Shared layers: the short causal convolution and its written-out backwards."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tmem.layers import ShortConv, causal_conv, causal_conv_silu, dense, linear


def test_short_conv_is_a_causal_depthwise_filter_that_continues():
    conv = ShortConv(3, 4, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (2, 9, 3))
    y, tail = conv(x)
    w = np.asarray(conv.kernel[...])
    padded = np.concatenate([np.zeros((2, 3, 3)), np.asarray(x)], 1)
    want = sum(padded[:, i:i + 9] * w[i] for i in range(4))  # w[3] meets the current token
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(tail, x[:, -3:])
    first, tail = conv(x[:, :5])
    second, _ = conv(x[:, 5:], tail)
    np.testing.assert_allclose(jnp.concatenate([first, second], 1), y, rtol=1e-6, atol=1e-6)


def test_causal_conv_gradients_equal_those_of_its_definition():
    padded, w, g = (jax.random.normal(jax.random.key(i), shape) for i, shape in
                    enumerate([(2, 12, 5), (4, 5), (2, 9, 5)]))

    def definition(padded, w):
        return sum(padded[:, i:i + 9] * w[i][None, None] for i in range(4))

    want = jax.vjp(definition, padded, w)[1](g)
    got = jax.vjp(causal_conv, padded, w)[1](g)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def _definition(padded, w, bias=None):
    y = sum(padded[:, i:i + 9] * w[i][None, None] for i in range(4))
    return jax.nn.silu(y if bias is None else y + bias[None, None])


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_the_filter_with_its_silu_equals_its_definition_values_and_gradients(bias):
    padded, w, g, b = (jax.random.normal(jax.random.key(i), shape) for i, shape in
                       enumerate([(2, 12, 5), (4, 5), (2, 9, 5), (5,)]))
    args = (padded, w, b if bias else None)
    want_y, want_vjp = jax.vjp(_definition, *args)
    got_y, got_vjp = jax.vjp(causal_conv_silu, *args)
    np.testing.assert_allclose(got_y, want_y, rtol=1e-5, atol=1e-6)
    for a, c in zip(got_vjp(g), want_vjp(g)):
        assert (a is None) == (c is None)
        if a is not None:
            np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-5)


def test_dense_and_its_linear_layer_equal_the_plain_product_values_and_gradients():
    """`dense` only rewrites the weight gradient's product; `linear` is an nnx.Linear through it."""
    ks = jax.random.split(jax.random.key(0), 4)
    x, w = jax.random.normal(ks[0], (3, 5, 7)), jax.random.normal(ks[1], (7, 4))
    dy = jax.random.normal(ks[2], (3, 5, 4))
    full = jax.lax.Precision.HIGHEST
    y, pullback = jax.vjp(lambda x, w: dense(x, w, full), x, w)
    y_ref, pullback_ref = jax.vjp(lambda x, w: jnp.matmul(x, w, precision=full), x, w)
    np.testing.assert_allclose(y, y_ref, rtol=1e-6)
    for got, want in zip(pullback(dy), pullback_ref(dy)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    layer = linear(7, 4, bias=True, rngs=nnx.Rngs(1))
    plain = nnx.Linear(7, 4, use_bias=True, rngs=nnx.Rngs(1))  # the same draws: the same parameters
    assert jax.tree.all(jax.tree.map(jnp.array_equal, nnx.state(layer), nnx.state(plain)))
    loss = lambda m: jnp.sum(m(x) * dy)  # noqa: E731
    np.testing.assert_allclose(loss(layer), loss(plain), rtol=1e-5)
    got, want = nnx.grad(loss)(layer), nnx.grad(loss)(plain)
    assert jax.tree.all(jax.tree.map(lambda a, b: np.allclose(a, b, rtol=1e-5, atol=1e-5), got, want))
