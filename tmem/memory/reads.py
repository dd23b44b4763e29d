"""Reads of a memory (Chapters 3, 5 and 6): linear, score-function and exponential.

A read of stored pairs is o(q) = sum_i sigma(k_i . q) v_i (the MLP's V^T sigma(K q)
when the pairs are weights). The score sigma sets the capacity: linear ~ d_k,
ReLU ~ 2 d_k, ReLU^p ~ 2 d_k^p / (2p - 1)!!, exponential ~ e^{2 beta (1 - beta/d_k)}.
A matrix state (stores.py) has only the linear read, o = S^T q.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from tmem.memory.softmax import softmax_read


def at_positions(x: jax.Array, read_at: jax.Array | None) -> jax.Array:
    """The reads (or queries) x [B, T, ...] at positions read_at [B, Q] -> [B, Q, ...]; all of x when read_at
    is None. Every memory and row that reads at the loss's positions takes them with it."""
    if read_at is None:
        return x
    return jnp.take_along_axis(x, read_at.reshape(read_at.shape + (1,) * (x.ndim - 2)), axis=1)


def relu_power(p: int) -> Callable[[jax.Array], jax.Array]:
    """sigma(s) = ReLU(s)^p: keeps a match of 1 at 1 and shrinks a typical 1/sqrt(d) to d^(-p/2)."""
    if p == 1:
        return jax.nn.relu
    return lambda s: jax.nn.relu(s) ** p


# Score functions sigma applied to each similarity k_i . q (Chapter 5). "swish_gate"
# is SwiGLU with the gate tied to the keys, Swish(s) s, as in the slides' table.
SCORES: dict[str, Callable[[jax.Array], jax.Array]] = {
    "linear": lambda s: s,
    "relu": relu_power(1),
    "relu2": relu_power(2),
    "relu3": relu_power(3),
    "gelu": jax.nn.gelu,
    "silu": jax.nn.silu,
    "swish_gate": lambda s: jax.nn.silu(s) * s,
}


def linear_read(S: jax.Array, q: jax.Array, precision=None) -> jax.Array:
    """o = S^T q for queries q [..., d_k] of a key-major state S [d_k, d_v].

    precision: the matmul's (None: the backend's default, TF32 on recent GPUs);
    an oracle test passes jax.lax.Precision.HIGHEST for full float32.
    """
    return jnp.matmul(q, S, precision=precision)


def score_weights(K: jax.Array, q: jax.Array, score: str) -> jax.Array:
    """sigma(K q): the weight each stored value gets, [..., M] for queries q [..., d_k]."""
    return SCORES[score](q @ K.T)


def score_read(K: jax.Array, V: jax.Array, q: jax.Array, score: str) -> jax.Array:
    """o = V^T sigma(K q): a two-layer MLP whose first matrix holds the keys and second the values."""
    return score_weights(K, q, score) @ V


def exp_read(K: jax.Array, V: jax.Array, q: jax.Array, beta) -> tuple[jax.Array, jax.Array]:
    """o = sum_i softmax_i(beta k_i . q) v_i for queries q [Q, d_k]: the exponential read (Chapter 6).

    The normaliser is shared by every term of one read, so it cancels in an
    interference-to-signal ratio. Returns the read-out [Q, d_v] and weights [Q, M].
    """
    mask = jnp.ones((1, 1, q.shape[0], K.shape[0]), bool)
    o, weights = softmax_read(q[None, :, None], K[None, :, None], V[None, :, None], mask, beta)
    return o[0, :, 0], weights[0, 0]
