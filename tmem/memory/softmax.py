"""The exponential read (Chapter 6): softmax attention as a key-value store."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def softmax_read(q_bthd, k_bshd, v_bshd, mask, beta):
    """o_t = sum_s softmax_s(beta q_t . k_s) v_s over the keys the mask allows.

    mask: bool, broadcastable to the scores [B, H, T, S] .

    Returns the read-out [B, T, H, D] and the attention weights [B, H, T, S].
    Scores are taken in float32 so a low-precision model keeps a stable softmax.
    """
    scores = beta * jnp.einsum("bthd,bshd->bhts", q_bthd, k_bshd).astype(jnp.float32)
    scores = jnp.where(mask, scores, -jnp.inf)
    weights = jax.nn.softmax(scores, axis=-1)
    o_bthd = jnp.einsum("bhts,bshd->bthd", weights.astype(v_bshd.dtype), v_bshd)
    return o_bthd, weights
