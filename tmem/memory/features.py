"""Feature maps phi of Chapter 12: a linear read of phi(k) approximates a similarity kernel.

The state stores phi(k_t) v_t^T and is read with phi(q_t), so the state has
d_phi x d_v entries per head: a map that expands the key width (DPFP) buys
capacity with state size, and Based's second-order Taylor map reads the
kernel 1 + q.k/sqrt(d) + (q.k)^2/(2d) exactly with d_phi = 1 + d + d^2; the
others keep d_phi = d_k.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

FEATURE_MAPS = ("identity", "elu", "relu", "dpfp", "taylor")


def feature_width(name: str, d_key: int, dpfp_nu: int = 1) -> int:
    """d_phi: the key width after the map."""
    if name == "taylor":
        return 1 + d_key + d_key * d_key
    return 2 * dpfp_nu * d_key if name == "dpfp" else d_key


def feature_map(name: str, x: jax.Array, dpfp_nu: int = 1) -> jax.Array:
    """phi applied to the last axis of x."""
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
    raise ValueError(f"unknown feature map {name!r}; allowed: {', '.join(FEATURE_MAPS)}")
