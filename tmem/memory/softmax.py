"""The exponential read (Chapter 6): softmax attention as a key-value store, and the scalings of its logits."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def softmax_read(q_bthd, k_bsgd, v_bsgd, mask, beta, *, scale=None, sink_h=None):
    """o_t = sum_s softmax_s(beta q_t . k_s) v_s over the keys the mask allows.

    k and v may have fewer heads G than q's H (grouped-query attention): query
    head h reads key-value head h // (H / G), as if each were repeated H / G times.
    mask: bool, broadcastable to the scores [B, H, T, S]. scale: a further factor
    of the logits broadcastable to the scores (length scaling), or None.
    sink_h [H]: a logit per head that joins each row's denominator and reads no
    value, so a query can put its weight nowhere (gpt-oss's sinks).

    Returns the read-out [B, T, H, D] and the attention weights [B, H, T, S]
    (with sinks, a row sums to less than one). Scores are taken in float32 so
    a low-precision model keeps a stable softmax.
    """
    B, T, H, d = q_bthd.shape
    S, G = k_bsgd.shape[1], k_bsgd.shape[2]
    if G == H:  # every head its own keys: the one einsum, as before grouped queries existed
        scores = jnp.einsum("bthd,bshd->bhts", q_bthd, k_bsgd)
    else:
        q = q_bthd.reshape(B, T, G, H // G, d)
        scores = jnp.einsum("btgrd,bsgd->bgrts", q, k_bsgd).reshape(B, H, T, S)
    scores = beta * scores.astype(jnp.float32)
    if scale is not None:
        scores = scores * scale
    scores = jnp.where(mask, scores, -jnp.inf)
    if sink_h is None:
        weights = jax.nn.softmax(scores, axis=-1)
    else:
        sink = jnp.broadcast_to(sink_h.astype(jnp.float32).reshape(1, H, 1, 1), (B, H, scores.shape[2], 1))
        weights = jax.nn.softmax(jnp.concatenate([scores, sink], axis=-1), axis=-1)[..., :S]
    weights_v = weights.astype(v_bsgd.dtype)
    if G == H:
        o_bthd = jnp.einsum("bhts,bshd->bthd", weights_v, v_bsgd)
    else:
        o = jnp.einsum("bgrts,bsgd->btgrd", weights_v.reshape(B, G, H // G, -1, S), v_bsgd)
        o_bthd = o.reshape(B, -1, H, v_bsgd.shape[-1])  # values may be narrower than keys (MLA's absorbed read)
    return o_bthd, weights


def visible_keys(q_pos, window: int | None):
    """n, the number of keys query position q_pos (0-based) sees: q_pos + 1, or at most the window."""
    n = q_pos + 1
    return n if window is None else jnp.minimum(n, window)


def logn_scale(n, train_length: int):
    """log_L(n) for n > L, 1 at and below the training length L: longer contexts sharpen, trained ones are untouched."""
    return jnp.maximum(jnp.log(n.astype(jnp.float32)) / math.log(train_length), 1.0)


def ssmax_scale(n, s_h):
    """Scalable-Softmax's s_h log n [..., H], s learned per head: the logits grow with the keys they compete with."""
    return jnp.log(n.astype(jnp.float32))[..., None] * s_h.reshape((1,) * n.ndim + s_h.shape)


def fused_read(q_bthd, k_bsgd, v_bsgd, beta, *, window: int | None = None, q_scale=None, implementation=None):
    """softmax_read of a whole causal sequence through `jax.nn.dot_product_attention`, without its weights.

    The same read as softmax_read with the causal mask (and a window's), for
    query t at key t: JAX picks its fused kernel where the backend has one
    (cuDNN's flash attention on a GPU, in bf16 or fp16) and XLA's einsums
    elsewhere. Grouped-query keys go in as they are (fewer key heads); a
    per-query length scale `q_scale`, broadcastable to [B, T, H, 1], scales
    the queries, which scales each query's logits alike. The weights are never
    formed, so a probe that reads them needs the plain path.
    """
    if q_scale is not None:
        q_bthd = (q_bthd * q_scale).astype(q_bthd.dtype)
    return jax.nn.dot_product_attention(q_bthd, k_bsgd, v_bsgd, scale=float(beta), is_causal=True,
                                        local_window_size=None if window is None else (window - 1, 0),
                                        implementation=implementation)
