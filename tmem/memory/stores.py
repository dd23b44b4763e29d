"""Writes of a matrix memory (Chapters 3, 4, 10 and 14): add, decay, least squares, delta, RLS, edit.

The state is key-major, S in R^{d_k x d_v}, read o = S^T q: the transpose of
the note's W = V^T K (S = W^T), the layout of the mixers (anchors/mixers.md).
Keys K [M, d_k] and values V [M, d_v] hold one pair per row, as in the note.
Everything here is one unbatched store; vmap for a batch of stores.

The writes form one ladder. Hebbian adds v k^T; every later rung is a
*corrective* write S + u (v - S^T k)^T that adds the prediction error along a
write direction u: the delta rule (u = beta k), recursive least squares
(u = R k / (1 + k^T R k)) and the rank-one edit (u = C^-1 k / k^T C^-1 k);
MEMIT's many-fact edit is the same correction for a block of keys at once.
The decayed write is beside the ladder: it shrinks the whole of S before it
adds, so it forgets old pairs instead of correcting them (Chapter 10).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def hebbian_write(K: jax.Array, V: jax.Array) -> jax.Array:
    """S = sum_i k_i v_i^T = K^T V: the outer-product store (Chapter 3, W = V^T K)."""
    return K.T @ V


def add_write(S: jax.Array, k: jax.Array, v: jax.Array, beta=1.0) -> jax.Array:
    """One Hebbian write, S + beta k v^T (the linear-attention update)."""
    return S + beta * jnp.outer(k, v)


def decayed_writes(S: jax.Array, K: jax.Array, V: jax.Array, gamma) -> jax.Array:
    """Decayed writes of the pairs in order, S <- gamma S + k v^T (Chapter 10's decay row).

    gamma is a scalar or one per pair [M] (a data-dependent gate). With a fixed
    gamma (RetNet's decay), M writes to S = 0 give sum_i gamma^(M-i) k_i v_i^T: the
    Hebbian store of the keys scaled by gamma^age, so old pairs fade instead of
    being corrected.
    """
    gamma = jnp.broadcast_to(jnp.asarray(gamma, S.dtype), K.shape[:1])

    def step(S, kvg):
        k, v, g = kvg
        return add_write(g * S, k, v), None

    return jax.lax.scan(step, S, (K, V, gamma))[0]


def lstsq_write(K: jax.Array, V: jax.Array, ridge: float = 0.0) -> jax.Array:
    """The least-squares store argmin_S sum_i ||S^T k_i - v_i||^2 (+ ridge ||S||^2) (Chapter 4, D3).

    M <= d_k: S = K^T (K K^T)^-1 V, the minimum-norm exact store (the dual basis);
    M >  d_k: S = (K^T K)^-1 K^T V, the note's W = V^T K (K^T K)^-1 transposed.
    Both are the same ridge solution; the form solves the smaller system.
    """
    M, d_k = K.shape
    if M <= d_k:
        gram = K @ K.T + ridge * jnp.eye(M, dtype=K.dtype)
        return K.T @ jnp.linalg.solve(gram, V)
    gram = K.T @ K + ridge * jnp.eye(d_k, dtype=K.dtype)
    return jnp.linalg.solve(gram, K.T @ V)


def corrective_write(S: jax.Array, k: jax.Array, u: jax.Array, v: jax.Array, precision=None) -> jax.Array:
    """S + u (v - S^T k)^T: write the error of the read at k along the direction u.

    precision: the read's matmul precision (None: the backend's default; an
    oracle test passes jax.lax.Precision.HIGHEST).
    """
    return S + jnp.outer(u, v - jnp.dot(k, S, precision=precision))


def delta_write(S: jax.Array, k: jax.Array, v: jax.Array, beta=1.0, precision=None) -> jax.Array:
    """The delta rule S + beta k (v - S^T k)^T = (I - beta k k^T) S + beta k v^T (Chapters 4, 10).

    One SGD step of size beta on 1/2 ||S^T k - v||^2; with a unit key and
    beta = 1 the pair is stored exactly (S^T k = v afterwards).
    """
    return corrective_write(S, k, beta * k, v, precision)


def delta_writes(S: jax.Array, K: jax.Array, V: jax.Array, beta=1.0) -> jax.Array:
    """Delta writes of the pairs in order (a scan); beta a scalar or one per pair [M]."""
    beta = jnp.broadcast_to(jnp.asarray(beta, S.dtype), K.shape[:1])

    def step(S, kvb):
        k, v, b = kvb
        return delta_write(S, k, v, b), None

    return jax.lax.scan(step, S, (K, V, beta))[0]


def rls_init(d_k: int, d_v: int, ridge: float = 1.0, dtype=jnp.float32):
    """Empty recursive-least-squares store: S = 0 and R = (ridge I)^-1."""
    return jnp.zeros((d_k, d_v), dtype), jnp.eye(d_k, dtype=dtype) / ridge


def rls_write(state, k: jax.Array, v: jax.Array):
    """One RLS write (Derivation D5): the delta rule along R k, R updated by Sherman-Morrison.

    After t writes S equals the ridge store (sum k k^T + ridge I)^-1 K^T V.
    """
    S, R = state
    Rk = R @ k
    denom = 1.0 + k @ Rk
    return corrective_write(S, k, Rk / denom, v), R - jnp.outer(Rk, Rk) / denom


def rls_writes(state, K: jax.Array, V: jax.Array):
    """RLS writes of the pairs in order (a scan)."""
    return jax.lax.scan(lambda st, kv: (rls_write(st, *kv), None), state, (K, V))[0]


def rank_one_edit(S: jax.Array, k_star: jax.Array, v_star: jax.Array, C: jax.Array | None = None) -> jax.Array:
    """Chapter 14's edit: the least change of S (in the metric C) with S'^T k* = v*.

    S' = S + C^-1 k* (v* - S^T k*)^T / (k*^T C^-1 k*), C the uncentred second
    moment E[k k^T] of the keys the memory reads. Every key k with
    k^T C^-1 k* = 0 reads as before. C = None is the plain (unwhitened) edit,
    which leaves the keys orthogonal to k* unchanged instead.
    """
    u = k_star if C is None else jnp.linalg.solve(C, k_star)
    return corrective_write(S, k_star, u / (k_star @ u), v_star)


def many_edit(S: jax.Array, K_E: jax.Array, V_E: jax.Array, C0: jax.Array, lam=0.0) -> jax.Array:
    """MEMIT's update of many facts at once (Chapter 14): the Delta to add to S.

    Delta minimises lam tr(Delta^T C0 Delta) + sum_e ||(S + Delta)^T k_e - v_e||^2:
    the edited keys K_E [E, d_k] should read V_E [E, d_v], and the preserved keys,
    with uncentred second moment C0 [d_k, d_k], should move little. In the note's
    layout (W = S^T, keys as columns) it is MEMIT's R K_E^T (lam C0 + K_E K_E^T)^-1
    with R the residuals V_E - K_E S; here it is computed in the push-through form
    C0^-1 K_E^T (lam I + K_E C0^-1 K_E^T)^-1 R, an E x E system, which stays
    defined at lam = 0: the least change in C0's metric that lands every edit
    exactly (needs independent keys). One edit at lam = 0 is rank_one_edit with C = C0.
    """
    R = V_E - K_E @ S
    CinvK = jnp.linalg.solve(C0, K_E.T)  # [d_k, E]
    gram = K_E @ CinvK + lam * jnp.eye(K_E.shape[0], dtype=S.dtype)
    return CinvK @ jnp.linalg.solve(gram, R)
