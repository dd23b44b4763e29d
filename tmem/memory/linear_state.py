"""The fast-weight write of Chapter 10 (add, decay, correct) as one rule, and its recurrent form.

The note's state S is d_v x d_k, written S_t = S_{t-1} + v_t k_t^T and read S_t q_t.
Here, as in the reference kernels (fla), the state is stored **key-major**, the
transpose: S is d_k x d_v per head, written with k_t v_t^T and read S_t^T q_t.
Every row of Chapter 10's table is one choice of three knobs in

    S_t = (I - e beta_t k_t k_t^T) Diag(a_t) S_{t-1} + beta_t k_t v_t^T,    o_t = S_t^T q_t

* the decay a_t = exp(g_t), kept as its log g_t <= 0: absent (a_t = 1, linear
  attention), a fixed scalar per head (RetNet), a data-dependent scalar per head
  (Mamba-2, Gated DeltaNet) or a data-dependent vector over key channels (GLA);
* the write strength beta_t (1 for linear attention; the note's beta_t for the
  delta rows; Mamba-2's step dt_t);
* the correction e: 0 adds the pair, 1 is the delta rule, which writes the
  error v_t - S'^T k_t of what the decayed state S' = Diag(a_t) S_{t-1} recalls.

Decaying before correcting is the order of the reference kernels (fla's gated
delta and KDA); for a scalar a_t it is the same as the note's
S_t = a_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T, transposed.

Shapes, per batch b, time t, head h: q, k [B, T, H, d_k], or [B, T, 1, d_k] for a q and k every head shares
(Mamba-2's one group: the chunked form then makes their scores once, not per head), v [B, T, H, d_v],
log_a None or [B, T, H, 1] (a scalar per head) or [B, T, H, d_k] (a vector), or
[1, T, H, ...] for a decay every example shares (RetNet's: its factors are made once, not per example),
beta None or [B, T, H], state None or [B, H, d_k, d_v]. The math runs in float32;
`precision` is that of every matmul (None: the backend's default, which is TF32
on recent GPUs; the oracle tests pass jax.lax.Precision.HIGHEST).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from tmem.memory.reads import linear_read
from tmem.memory.stores import add_write, delta_write


def retnet_log_decay(heads: int) -> jax.Array:
    """RetNet's fixed decay, log gamma_h with gamma_h = 1 - 2^(-5-h) for head h: [heads]."""
    return jnp.log(1.0 - 2.0 ** (-5.0 - jnp.arange(heads, dtype=jnp.float32)))


def prepare(q, k, v, log_a, beta, state):
    """Inputs in float32 with the defaults filled in: no decay, beta = 1, an empty state."""
    B, T, H, dv = v.shape
    dk = k.shape[-1]
    if q.shape != k.shape or k.shape[:2] != (B, T) or k.shape[2] not in (1, H):
        raise ValueError(f"q and k must be [B, T, H or 1, d_k] for v {v.shape}, got {q.shape} and {k.shape}")
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    log_a = jnp.zeros((B, T, H, 1), jnp.float32) if log_a is None else f32(log_a)
    beta = jnp.ones((B, T, H), jnp.float32) if beta is None else f32(beta)
    state = jnp.zeros((B, H, dk, dv), jnp.float32) if state is None else f32(state)
    if log_a.shape[-1] not in (1, dk) or log_a.shape[0] not in (1, B) or log_a.shape[1:-1] != (T, H):
        raise ValueError(f"log_a must be [B or 1, T, H, 1] or [B or 1, T, H, d_k], got {log_a.shape}")
    return f32(q), f32(k), f32(v), log_a, beta, state


def recurrent(q, k, v, *, log_a=None, beta=None, delta: bool = False, state=None, precision=None):
    """The definition: one token at a time (lax.scan). Returns o [B, T, H, d_v] and the final state."""
    out_dtype = v.dtype
    q, k, v, log_a, beta, state = prepare(q, k, v, log_a, beta, state)
    q, k = (jnp.broadcast_to(x, x.shape[:2] + v.shape[2:3] + x.shape[3:]) for x in (q, k))  # a shared q and k

    # the stores' own writes and read (tmem.memory.stores, .reads), one head of one example each:
    # the delta rule writes the error of what the decayed state recalls at k_t
    write = jax.vmap(jax.vmap(partial(delta_write, precision=precision) if delta else add_write))
    read = jax.vmap(jax.vmap(partial(linear_read, precision=precision)))

    def write_and_read(S, x):
        q_t, k_t, v_t, g_t, beta_t = x  # [B, H, d] and beta_t [B, H]
        S = write(jnp.exp(g_t)[..., None] * S, k_t, v_t, beta_t)  # Diag(a_t) S: a_t scales key channels
        return S, read(S, q_t)

    time_major = lambda x: jnp.moveaxis(x, 1, 0)  # noqa: E731
    final, o = jax.lax.scan(write_and_read, state, tuple(map(time_major, (q, k, v, log_a, beta))))
    return time_major(o).astype(out_dtype), final
