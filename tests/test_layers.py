"""Shared layers: the short causal convolution."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tmem.layers import ShortConv


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
