"""The modern Hopfield read (Chapter 6, Derivation D8): softmax attention whose keys are its values.

The stored patterns are the rows x_s of X. A query (the cue) xi is updated by

    xi <- X^T softmax(beta X xi),

the stationary condition of the energy E(xi) = -1/beta ln sum_s exp(beta x_s . xi) + xi . xi / 2.
One update is one attention read with keys and values both X; repeating it
moves xi toward a fixed point, where the update leaves it unchanged. beta sets
which fixed point: beta = 0 gives the mean of the patterns, a large beta the
pattern with the largest inner product with the cue (the nearest one only when
all patterns have the same norm).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tmem.memory.softmax import softmax_read


def hopfield_update(xi_bthd, x_bshd, mask, beta):
    """One update of every query xi_t over the patterns x_s the mask allows it: the softmax read with the
    patterns as keys and values.

    mask: bool, broadcastable to the scores [B, H, T, S]; beta a scalar or an
    array broadcastable to them (one per head: [1, H, 1, 1]). Returns the new
    xi [B, T, H, d] and the weights [B, H, T, S].
    """
    return softmax_read(xi_bthd, x_bshd, x_bshd, mask, beta)


def hopfield_read(xi_bthd, x_bshd, mask, beta, iterations: int = 1, tolerance: float | None = None):
    """xi after `iterations` updates, the last update's weights, and how many updates ran.

    Without a tolerance the count is fixed and every update is differentiated
    through (unrolled: the count is small, and a loop would hide its body from
    XLA's FLOP count). With a tolerance the updates stop once one moves xi by
    less than it in every coordinate (at most `iterations` of them): a while
    loop, whose length depends on the data, so it has no reverse-mode gradient
    and serves evaluation only.
    """
    xi, weights = hopfield_update(xi_bthd, x_bshd, mask, beta)
    if tolerance is None:
        for _ in range(iterations - 1):
            xi, weights = hopfield_update(xi, x_bshd, mask, beta)
        return xi, weights, iterations

    def step(carry):
        xi, _, n, _ = carry
        new, weights = hopfield_update(xi, x_bshd, mask, beta)
        return new, weights, n + 1, jnp.max(jnp.abs(new - xi))

    def moving(carry):
        _, _, n, moved = carry
        return (n < iterations) & (moved >= tolerance)

    first = (xi, weights, jnp.asarray(1), jnp.max(jnp.abs(xi - xi_bthd)))
    xi, weights, n, _ = jax.lax.while_loop(moving, step, first)
    return xi, weights, n
