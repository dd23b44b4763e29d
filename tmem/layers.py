"""Shared layers: norms, rotary positions, the linear layer, short convolutions (the MLPs are in tmem/mlps)."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from flax import nnx

NORMS = ("layernorm", "rmsnorm", "none")


class Fixed(nnx.Variable):
    """A weight training does not change: not an nnx.Param, so the optimizer never sees it; a checkpoint keeps it
    with the model's other variables."""


def make_norm(kind: str, width: int, rngs: nnx.Rngs):
    """A norm by name; "none" is the identity (attention-only toy models)."""
    if kind == "layernorm":
        return nnx.LayerNorm(width, epsilon=1e-5, rngs=rngs)
    if kind == "rmsnorm":
        return nnx.RMSNorm(width, epsilon=1e-6, rngs=rngs)
    if kind == "none":
        return lambda x: x
    raise ValueError(f"unknown norm {kind!r}; allowed: {', '.join(NORMS)}")


def rope(x_bthd: jax.Array, positions: jax.Array, base: float = 10_000.0) -> jax.Array:
    """Rotary positions (rotate-half form): pairs (i, i + D/2) turn by pos * base^(-2i/D).

    positions: [T] shared by the batch, or [B, T] per example.
    """
    D = x_bthd.shape[-1]
    freq = base ** (-jnp.arange(0, D // 2, dtype=jnp.float32) * 2 / D)
    freq = freq.reshape((1,) * positions.ndim + freq.shape)
    angle = (positions[..., None].astype(jnp.float32) * freq)[..., None, :]  # [(B,) T, 1, D/2]
    angle = angle.reshape((1,) * (x_bthd.ndim - angle.ndim) + angle.shape)
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    x1, x2 = x_bthd[..., : D // 2], x_bthd[..., D // 2 :]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x_bthd.dtype)


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def dense(x: jax.Array, w: jax.Array, precision=None) -> jax.Array:
    """x [..., n] @ w [n, m], with the weight's gradient taken as (dy^T x)^T.

    Autodiff's x^T dy contracts both operands over their leading (token) axis;
    XLA's CPU backend then wrote the larger one, dy, transposed inside the
    fusion that made it (a strided write, the most expensive operation of the
    linear row's backward). As dy^T x, transposed after, it contracts both in
    place: the linear row's step took 0.85 of the time (BENCHMARKS.md).
    """
    return jnp.matmul(x, w, precision=precision)


def _dense_fwd(x, w, precision):
    return dense(x, w, precision), (x, w)


def _dense_bwd(precision, residuals, dy):
    x, w = residuals
    rows = lambda a: a.reshape(-1, a.shape[-1])  # noqa: E731
    d_w = jnp.matmul(rows(dy).T, rows(x), precision=precision).T
    return jnp.matmul(dy, w.T, precision=precision), d_w


dense.defvjp(_dense_fwd, _dense_bwd)


def _dense_dot_general(lhs, rhs, dimension_numbers, precision=None, **unset):
    """nnx.Linear's product through `dense`: Linear always contracts the input's last axis with the kernel's
    first, and `linear` sets no element type and passes no sharding (`unset`, all None)."""
    del dimension_numbers, unset
    return dense(lhs, rhs, precision)


def linear(n_in: int, n_out: int, *, bias: bool, rngs: nnx.Rngs,
           bias_init=nnx.initializers.zeros_init()) -> nnx.Linear:
    """An nnx.Linear (the same parameters, initialisation and dtype handling) whose product is `dense`."""
    return nnx.Linear(n_in, n_out, use_bias=bias, bias_init=bias_init, dot_general=_dense_dot_general, rngs=rngs)


@jax.custom_vjp
def causal_conv(padded: jax.Array, w: jax.Array) -> jax.Array:
    """y_t = sum_i w_i * padded_{t+i}: padded [B, T+K-1, C] (K-1 earlier inputs first), w [K, C] -> [B, T, C].

    Row K-1 of the kernel multiplies the current token, row 0 the one K-1 steps
    back. The backward is written out (the same filter run backwards over the
    padded output gradient): with XLA's own, a pad per tap summed and
    transposed in one fusion, a CPU training step of the linear row took 49.5
    ms against 41.5 ms with this one (BENCHMARKS.md).
    """
    K, T = w.shape[0], padded.shape[1] - w.shape[0] + 1
    return sum(padded[:, i:i + T] * w[i][None, None] for i in range(K))


def _causal_conv_fwd(padded, w):
    return causal_conv(padded, w), (padded, w)


def _causal_conv_bwd(residuals, g):
    padded, w = residuals
    return _conv_transpose(padded, w, g)


def _conv_transpose(padded, w, g):
    """The input and kernel gradients of causal_conv for the output gradient g."""
    K, T = w.shape[0], g.shape[1]
    g_padded = jnp.pad(g, ((0, 0), (K - 1, K - 1), (0, 0)))  # input s feeds outputs s-K+1 .. s
    d_padded = sum(g_padded[:, K - 1 - i:K - 1 - i + padded.shape[1]] * w[i][None, None] for i in range(K))
    # the sums over batch and time as one matmul with a row of ones, the form XLA's CPU backend runs fastest: as
    # einsums ("btc,btc->c", batched over c) or as reductions over the leading axes they cost several times more
    B, _, C = g.shape
    products = jnp.stack([g * padded[:, i:i + T] for i in range(K)], axis=2).reshape(B * T, K * C)
    d_w = (jnp.ones((1, B * T), g.dtype) @ products).reshape(K, C)
    return d_padded, d_w


causal_conv.defvjp(_causal_conv_fwd, _causal_conv_bwd)


@jax.custom_vjp
def causal_conv_silu(padded: jax.Array, w: jax.Array, bias: jax.Array | None) -> jax.Array:
    """silu(causal_conv(padded, w) + bias), bias [C] or None: the fast-weight rows' filter and its activation.

    One backward for both: the gradient at the filter's output is made once and
    kept whole, so that XLA does not copy the activation's derivative into each
    of the filter's K taps and into the kernel gradient's products (inside a CPU
    training step that duplicated work cost more than the filter itself).
    """
    return jax.nn.silu(_biased_conv(padded, w, bias))


def _biased_conv(padded, w, bias):
    y = causal_conv(padded, w)
    return y if bias is None else y + bias[None, None]


def _causal_conv_silu_fwd(padded, w, bias):
    # made once and kept: with a bias, XLA otherwise put the filter's taps and the bias into each of the
    # activation's and the backward's fusions, 8 copies of the filter per layer (Mamba-2's step)
    y = jax.lax.optimization_barrier(_biased_conv(padded, w, bias))
    return jax.nn.silu(y), (padded, w, y, bias)


def _causal_conv_silu_bwd(residuals, d_out):
    padded, w, y, bias = residuals
    s = jax.nn.sigmoid(y)
    g = jax.lax.optimization_barrier(d_out * s * (1 + y * (1 - s)))
    d_padded, d_w = _conv_transpose(padded, w, g)
    B, T, C = g.shape
    d_bias = (jnp.ones((1, B * T), g.dtype) @ g.reshape(B * T, C))[0] if bias is not None else None
    return d_padded, d_w, d_bias


causal_conv_silu.defvjp(_causal_conv_silu_fwd, _causal_conv_silu_bwd)


@jax.custom_vjp
def l2_normalize(x):
    """x / sqrt(|x|^2 + 1e-6) along the last axis: unit q and k for the fast-weight and mesa rows."""
    return x * jax.lax.rsqrt(jnp.sum(jnp.square(x), axis=-1, keepdims=True) + 1e-6)


def _l2_normalize_fwd(x):
    r = jax.lax.rsqrt(jnp.sum(jnp.square(x), axis=-1, keepdims=True) + 1e-6)
    y = x * r
    return y, (y, r)


def _l2_normalize_bwd(residuals, dy):
    # written out, dx = r (dy - y (y . dy)): one pass, where autodiff's goes through the rsqrt in several
    y, r = residuals
    return (r * (dy - y * jnp.sum(y * dy, axis=-1, keepdims=True)),)


l2_normalize.defvjp(_l2_normalize_fwd, _l2_normalize_bwd)


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def rms_norm(x: jax.Array, scale: jax.Array, epsilon: float) -> jax.Array:
    """x / sqrt(mean(x^2) + epsilon) * scale over the last axis: nnx.RMSNorm's math.

    Written out, with its backward: nnx.RMSNorm's general mean-and-variance path
    cost several times more inside a CPU training step, and autodiff's backward,
    fused by XLA into whatever follows the norm (a gate's activation, a read at
    a few positions), computed the same derivative many times over.
    """
    return _rms_norm_fwd(x, scale, epsilon)[0]


def _rms_norm_fwd(x, scale, epsilon):
    r = jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + epsilon)
    x_hat = x * r
    return x_hat * scale.reshape((1,) * (x.ndim - 1) + scale.shape), (x_hat, r, scale)


def _rms_norm_bwd(epsilon, residuals, dy):
    del epsilon
    x_hat, r, scale = residuals
    g = jax.lax.optimization_barrier(dy * scale.reshape((1,) * (dy.ndim - 1) + scale.shape))
    dx = r * (g - x_hat * jnp.mean(x_hat * g, axis=-1, keepdims=True))
    return dx, jnp.sum((dy * x_hat).reshape(-1, dy.shape[-1]), axis=0)


rms_norm.defvjp(_rms_norm_fwd, _rms_norm_bwd)


class ShortConv(nnx.Module):
    """Depthwise causal convolution over time: y_t = sum_{i<K} w_{K-1-i} * x_{t-i}, channel by channel.

    Gives each token a view of the few tokens before it, the previous-token
    information a fast-weight memory cannot compute by itself (its read is a
    sum over the whole past). `tail` [B, K-1, C] continues an earlier call.
    """

    def __init__(self, channels: int, kernel: int, *, bias: bool = False, rngs: nnx.Rngs):
        self.kernel_size = kernel
        bound = kernel ** -0.5  # PyTorch's Conv1d default for a depthwise filter: fan-in = kernel
        self.kernel = nnx.Param(jax.random.uniform(rngs.params(), (kernel, channels), minval=-bound, maxval=bound))
        self.bias = nnx.Param(jnp.zeros((channels,))) if bias else None

    def __call__(self, x_btc: jax.Array, tail: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """Output [B, T, C] and the last K-1 inputs (the tail for the next call)."""
        bias = None if self.bias is None else self.bias[...]
        return short_conv(x_btc, self.kernel[...], tail, bias)


def short_conv(x_btc: jax.Array, kernel: jax.Array, tail: jax.Array | None = None, bias: jax.Array | None = None,
               *, silu: bool = False) -> tuple[jax.Array, jax.Array]:
    """ShortConv's filter as a function of its kernel [K, C], with a SiLU after it if asked: layers that keep
    several filters run them as one, their kernels side by side, so the channels of all of them pass through one
    program."""
    B, T, C = x_btc.shape
    K = kernel.shape[0]
    if tail is None:  # a pad, which XLA fuses into its consumers, where a concatenation with zeros is a copy
        padded = jnp.pad(x_btc, ((0, 0), (K - 1, 0), (0, 0)))
    else:
        padded = jnp.concatenate([tail.astype(x_btc.dtype), x_btc], axis=1)
    if silu:
        return causal_conv_silu(padded, kernel, bias), padded[:, T:]
    y = causal_conv(padded, kernel)
    if bias is not None:  # kept whole: left to fuse, XLA copies the add and the SiLU after it into every consumer
        y = jax.lax.optimization_barrier(y + bias[None, None])
    return y, padded[:, T:]
