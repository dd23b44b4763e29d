"""Linear self-attention (Chapter 11): the Hebbian store read with the identity score.

One LSA head writes the outer products of its keys and values into a store
and reads it with each query, no softmax and no normalisation:

    S = sum_s k_s v_s^T        o_t = S^T q_t = sum_s (q_t . k_s) v_s

This is linear attention with the identity feature map (Chapter 9). The only
choice is which tokens write and which read: causally (token t reads the
writes of s <= t), or over a prompt, where the context tokens write once and
every token, the query included, reads the same store (von Oswald et al.).
The state is key-major, d_k x d_v per head, read S^T q: the transpose of the
note's S = sum v k^T.

Proposition 1 of von Oswald et al. (Chapter 11, Derivation D11) gives weights
for which one such layer over [x_i, y_i] tokens is one gradient-descent step on
L(W) = 1/(2N) sum_i ||W x_i - y_i||^2; `gd_construction` builds them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def write_store(k_bshd: jax.Array, v_bshd: jax.Array, write_bs: jax.Array | None = None) -> jax.Array:
    """S = sum_s w_s k_s v_s^T per head: [B, H, d_k, d_v]. write_bs weighs each token's write (0 = none)."""
    if write_bs is not None:
        v_bshd = v_bshd * write_bs[:, :, None, None].astype(v_bshd.dtype)
    return jnp.einsum("bshk,bshv->bhkv", k_bshd, v_bshd)


def read_store(S_bhkv: jax.Array, q_bthd: jax.Array) -> jax.Array:
    """o_t = S^T q_t per head: [B, T, H, d_v]."""
    return jnp.einsum("bhkv,bthk->bthv", S_bhkv, q_bthd)


def masked_read(q_bthd: jax.Array, k_bshd: jax.Array, v_bshd: jax.Array, mask) -> jax.Array:
    """o_t = sum_s mask[t, s] (q_t . k_s) v_s: the same read as attention with identity scores.

    mask: broadcastable to [B, H, T, S] (bool or weights). For short prompts
    this quadratic form is the cheapest way to read causally.
    """
    scores = jnp.einsum("bthd,bshd->bhts", q_bthd, k_bshd)
    scores = jnp.where(mask, scores, 0.0)
    return jnp.einsum("bhts,bshd->bthd", scores, v_bshd)


def prompt_read(q_bthd, k_bshd, v_bshd, n_context: int) -> tuple[jax.Array, jax.Array]:
    """The first n_context tokens write, every query reads: (read-out [B, T, H, d_v], store S)."""
    S = write_store(k_bshd[:, :n_context], v_bshd[:, :n_context])
    return read_store(S, q_bthd), S


def causal_read(q_bthd, k_bshd, v_bshd, q_pos, S0_bhkv=None) -> tuple[jax.Array, jax.Array]:
    """Token t reads the writes of tokens s <= t (plus an earlier store S0): (read-out, final store).

    q_pos: positions of the queries, [T] or [B, Q], counted within this call.
    """
    s_pos = jnp.arange(k_bshd.shape[1]).reshape((1,) * q_pos.ndim + (-1,))
    mask = s_pos <= q_pos[..., None]  # [T, S] or [B, Q, S]
    mask = mask[None, None] if q_pos.ndim == 1 else mask[:, None]
    o = masked_read(q_bthd, k_bshd, v_bshd, mask)
    S = write_store(k_bshd, v_bshd)
    if S0_bhkv is not None:
        o = o + read_store(S0_bhkv, q_bthd)
        S = S + S0_bhkv
    return o, S


def gd_construction(d: int, o: int, eta_over_n: float, w0=None, gamma: float = 0.0) -> dict[str, np.ndarray]:
    """Proposition 1's W_Q, W_K, W_V, P (column convention: q = W_Q e) for tokens e = [x (d), y (o)].

        W_Q = W_K = [[I_d, 0], [0, 0]]    W_V = [[c I_d, 0], [W_0, -I_o]]    P = diag(-gamma I_d, eta/N I_o)

    with c = 1 if gamma else 0. Then one layer maps every y_j to y_j - dW x_j,
    dW = -(eta/N) sum_i (W_0 x_i - y_i) x_i^T one GD step from W_0, so a query
    entering as [x_q, -W_0 x_q] leaves as [x_q, -W_1 x_q]. gamma != 0 also moves
    every x_j to (I - gamma X X^T) x_j: the GD++ preconditioning step.
    """
    D = d + o
    W_QK = np.zeros((D, D))
    W_QK[:d, :d] = np.eye(d)
    W_V = np.zeros((D, D))
    W_V[d:, d:] = -np.eye(o)
    W_V[d:, :d] = 0.0 if w0 is None else np.asarray(w0, np.float64).reshape(o, d)
    if gamma:
        W_V[:d, :d] = np.eye(d)
    P = np.diag(np.concatenate([np.full(d, -gamma), np.full(o, eta_over_n)]))
    return {"W_Q": W_QK, "W_K": W_QK.copy(), "W_V": W_V, "P": P}
