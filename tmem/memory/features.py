"""Feature maps phi of Chapter 12: a linear read of phi(k) approximates a similarity kernel.

The state stores phi(k_t) v_t^T and is read with phi(q_t), so the state has
d_phi x d_v entries per head: a map that expands the key width (DPFP) buys
capacity with state size, and Based's second-order Taylor map reads the
kernel 1 + q.k/sqrt(d) + (q.k)^2/(2d) exactly with d_phi = 1 + d + d^2;
Performer's positive random features read exp(q.k/sqrt(d)) itself, without
bias and with a variance that falls as 1/m, through m random projections drawn
once (d_phi = m). The others keep d_phi = d_k.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

FEATURE_MAPS = ("identity", "elu", "relu", "dpfp", "taylor", "performer")


def feature_width(name: str, d_key: int, dpfp_nu: int = 1, num_features: int = 0) -> int:
    """d_phi: the key width after the map."""
    if name == "taylor":
        return 1 + d_key + d_key * d_key
    if name == "performer":
        return num_features
    return 2 * dpfp_nu * d_key if name == "dpfp" else d_key


def random_features(key: jax.Array, d: int, m: int, orthogonal: bool = False) -> jax.Array:
    """Performer's projection W [d, m]: columns w_i ~ N(0, I_d), or (orthogonal) blocks of d mutually orthogonal
    columns, each with the length of a Gaussian vector, so every w_i is still N(0, I_d) alone and the estimate
    stays unbiased while its variance falls (Choromanski et al., Theorem 2)."""
    if not orthogonal:
        return jax.random.normal(key, (d, m))
    blocks, lengths = jax.random.split(key)
    n = math.ceil(m / d)
    q, r = jnp.linalg.qr(jax.random.normal(blocks, (n, d, d)))  # [n, d, d]: each block's columns orthonormal
    # signed by R's diagonal, so each column is uniform on the sphere (QR alone leans towards its Gaussian's start)
    q = q * jnp.sign(jnp.diagonal(r, axis1=-2, axis2=-1))[:, None, :]
    q = q.transpose(1, 0, 2).reshape(d, n * d)[:, :m]
    return q * jnp.linalg.norm(jax.random.normal(lengths, (d, m)), axis=0)[None, :]


def performer(x: jax.Array, w: jax.Array, stabilise: bool = False) -> jax.Array:
    """Positive random features phi(x) = exp(w_i . x' - |x'|^2 / 2) / sqrt(m) of x' = x / d^(1/4), so that
    E[phi(q).phi(k)] = exp(q.k / sqrt(d)), softmax attention's kernel (FAVOR+).

    The exponent is |w|^2/2 - |x' - w|^2/2 <= |w|^2/2, so no feature overflows (|w|^2 ~ d, far below float32's
    limit of 176 for the key widths here); a far-off x' can underflow every feature instead. `stabilise` subtracts
    each token's largest exponent, as the paper does for queries: a factor per token, which a normalised read
    divides out of its numerator and denominator alike (keys keep theirs: each key's scale is its weight).
    """
    x = x * x.shape[-1] ** -0.25
    logits = x @ w - 0.5 * jnp.sum(x * x, axis=-1, keepdims=True)
    if stabilise:
        logits = logits - jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    return jnp.exp(logits - 0.5 * math.log(w.shape[-1]))


def feature_map(name: str, x: jax.Array, dpfp_nu: int = 1, projection: jax.Array | None = None,
                stabilise: bool = False) -> jax.Array:
    """phi applied to the last axis of x; performer's with its drawn `projection` [d, m] (and `stabilise`)."""
    if name == "identity":
        return x
    if name == "elu":  # Katharopoulos et al.: positive, and its gradient is never zero
        return jax.nn.elu(x) + 1.0
    if name == "relu":
        return jax.nn.relu(x)
    if name == "dpfp":
        # Schlag et al.'s deterministic parameter-free projection: the 2d coordinates
        # relu([x, -x]) multiplied by themselves shifted by 1..nu places (cyclically),
        # so products of pairs of coordinates act as new, mostly orthogonal features.
        r = jnp.concatenate([jax.nn.relu(x), jax.nn.relu(-x)], axis=-1)
        return jnp.concatenate([r * jnp.roll(r, shift, axis=-1) for shift in range(1, dpfp_nu + 1)], axis=-1)
    if name == "taylor":
        # Based's (Arora et al.): phi(x) = [1, x / d^(1/4), (x x^T) / (sqrt(2) sqrt(d))], so phi(q).phi(k) is the
        # exponential's second-order Taylor expansion at q.k / sqrt(d): every feature's scale is in the map, the
        # kernel is positive (1 + s + s^2/2 > 0) although the features are not
        d = x.shape[-1]
        outer = (x[..., :, None] * x[..., None, :]).reshape(*x.shape[:-1], d * d)
        return jnp.concatenate([jnp.ones_like(x[..., :1]), x * d ** -0.25, outer * (2 * d) ** -0.5], axis=-1)
    if name == "performer":
        return performer(x, projection, stabilise)
    raise ValueError(f"unknown feature map {name!r}; allowed: {', '.join(FEATURE_MAPS)}")
