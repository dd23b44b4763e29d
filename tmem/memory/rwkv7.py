"""RWKV-7's memory: the generalised delta rule, a per-channel decay and a removal along its own key.

The note's (value-major) state S [d_v, d_k] per head is written

    S_t = S_{t-1} (Diag(w_t) - kh_t (a_t * kh_t)^T) + v_t kt_t^T,    o_t = S_t r_t,

with w_t the per-channel decay, kh_t the unit removal key, a_t the per-channel
in-context rate and kt_t the replacement key. Stored key-major as the other
rows (M = S^T, d_k x d_v, read M^T r), it is the diagonal-plus-low-rank
transition of fla's generalised delta rule,

    M_t = (Diag(w_t) + alpha_t beta_t^T) M_{t-1} + kt_t v_t^T,    alpha_t = -(a_t * kh_t), beta_t = kh_t.

`recurrent` is the definition. `chunked` is its chunked form (fla's DPLR /
`generalized_delta_rule`, derived here in the key-major layout). Unrolled over
a chunk with b_t the chunk-local cumulative log decay, the state is a decayed
sum of rank-one writes, two per token,

    M_t = e^{b_t} * M + sum_{j <= t} e^{b_t - b_j} * (alpha_j h_j^T + kt_j v_j^T),

where h_j = M_{j-1}^T beta_j is what the removal key reads just before token j.
Those reads depend on each other through a unit lower-triangular system, the
UT transform as in the delta rule:

    (I - L) H = E M + P V,   L_ji = sum_c beta_jc alpha_ic e^{b_(j-1)c - b_ic},
                             P_ji = sum_c beta_jc kt_ic e^{b_(j-1)c - b_ic}   (i < j),
                             E_j = beta_j * e^{b_(j-1)},

so H = U + W M with U = (I - L)^{-1} P V and W = (I - L)^{-1} E made for all
chunks at once, and only the state passes between chunks (a lax.scan). The
exponents b_(j-1) - b_i = (b_j - b_i) - g_j put the query side one token
back: tmem.memory.chunked's scores take beta_j e^{-g_j}, which stays below
e^{0.61} because RWKV-7's decay w = exp(-e^{-1/2} sigmoid(.)) is never below
e^{-0.61}; the layer's decay, not this function, guarantees it. The reads are

    o_t = (r_t * e^{b_t})^T M + sum_{j <= t} [(r_t . (alpha_j * e^{b_t - b_j})) h_j + (r_t . (kt_j * e^{b_t - b_j})) v_j].

Shapes, per batch b, time t, head h: r, log_w, kh, a, kt [B, T, H, d_k], v [B, T, H, d_v], state None or
[B, H, d_k, d_v]; log_w = log w_t <= 0. The math runs in float32.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp

from tmem.memory.chunked import _lower, intra_scores, unit_lower_solve


def _prepare(r, log_w, kh, a, kt, v, state):
    f32 = lambda y: jnp.asarray(y, jnp.float32)  # noqa: E731
    B, _, H, dv = v.shape
    state = jnp.zeros((B, H, r.shape[-1], dv), jnp.float32) if state is None else f32(state)
    return (*map(f32, (r, log_w, kh, a, kt, v)), state)


def recurrent(r, log_w, kh, a, kt, v, *, state=None, precision=None):
    """The definition, a token at a time (lax.scan): o [B, T, H, d_v] and the final state [B, H, d_k, d_v]."""
    out_dtype = v.dtype
    r, log_w, kh, a, kt, v, state = _prepare(r, log_w, kh, a, kt, v, state)
    einsum = partial(jnp.einsum, precision=precision)

    def step(M, inputs):
        r_t, g_t, kh_t, a_t, kt_t, v_t = inputs  # [B, H, d]
        removed = einsum("bhk,bhkv->bhv", kh_t, M)  # what the removal key reads, M^T kh
        M = (jnp.exp(g_t)[..., None] * M - (a_t * kh_t)[..., None] * removed[..., None, :]
             + kt_t[..., None] * v_t[..., None, :])
        return M, einsum("bhk,bhkv->bhv", r_t, M)

    time_major = lambda y: jnp.moveaxis(y, 1, 0)  # noqa: E731
    final, o = jax.lax.scan(step, state, tuple(map(time_major, (r, log_w, kh, a, kt, v))))
    return time_major(o).astype(out_dtype), final


# the blocks tmem.memory.chunked's vector scores fall back to where a chunk's decays do not fit one reference; here
# they always fit (a log decay above -0.61 spans at most 39 over 64 tokens), so this only bounds what XLA compiles
SUB_CHUNK = 16


def chunked(r, log_w, kh, a, kt, v, *, state=None, chunk: int = 64, precision=None):
    """Same inputs and outputs as `recurrent`, equal to it up to float rounding; `chunk` tokens a chunk (any
    size: the sequence is padded with tokens that neither write nor decay)."""
    einsum = partial(jnp.einsum, precision=precision)
    out_dtype, empty = v.dtype, state is None
    r, g, kh, a, kt, v, state = _prepare(r, log_w, kh, a, kt, v, state)
    B, T, H, dv = v.shape
    N = math.ceil(T / chunk)
    pad = N * chunk - T

    def chunks(x):  # [B, T, H, d] -> [N, B, H, C, d]
        x = jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0)))
        return jnp.moveaxis(x.reshape(B, N, chunk, H, x.shape[-1]), (1, 3), (0, 2))

    r, g, beta, a, kt, v = map(chunks, (r, g, kh, a, kt, v))
    alpha = -(a * beta)
    # chunk-local cumulative log decay, a matmul with a triangle of ones in full float32 (tmem.memory.chunked)
    b = jnp.einsum("ij,...jc->...ic", _lower(chunk).astype(g.dtype), g, precision=jax.lax.Precision.HIGHEST)
    b_end = b[..., -1:, :]
    beta_back = beta * jnp.exp(-g)  # beta_j e^{b_(j-1) - b_j}: the removal reads the state before its token
    strict = _lower(chunk, strict=True)
    L = intra_scores(beta_back, alpha, b, SUB_CHUNK, precision)  # the solve reads below the diagonal only
    P = jnp.where(strict, intra_scores(beta_back, kt, b, SUB_CHUNK, precision), 0.0)
    rhs = einsum("...ji,...iv->...jv", P, v)
    from_state = not (empty and N == 1)
    if from_state:
        rhs = jnp.concatenate([rhs, beta * jnp.exp(b - g)], axis=-1)  # E_j = beta_j e^{b_(j-1)}
    solved = unit_lower_solve(-L, rhs, precision)
    U, W = solved[..., :dv], solved[..., dv:]
    to_end = jnp.exp(b_end - b)
    alpha_end, kt_end = alpha * to_end, kt * to_end
    writes = einsum("...ck,...cv->...kv", kt_end, v)  # what the replacement keys write, whatever the state

    def pass_state(M, x):
        U_n, W_n, alpha_end_n, writes_n, across_n = x
        H_n = U_n + einsum("...ck,...kv->...cv", W_n, M)
        return across_n[..., 0, :, None] * M + einsum("...ck,...cv->...kv", alpha_end_n, H_n) + writes_n, (M, H_n)

    if not from_state:  # one chunk from an empty state: no state enters, H = U
        final, M_in, Hs = einsum("...ck,...cv->...kv", alpha_end[0], U[0]) + writes[0], None, U
    else:
        xs = (U, W, alpha_end, writes, jnp.exp(b_end))
        final, (M_in, Hs) = jax.lax.scan(pass_state, state, xs)
    o = (einsum("...ij,...jv->...iv", intra_scores(r, alpha, b, SUB_CHUNK, precision), Hs)
         + einsum("...ij,...jv->...iv", intra_scores(r, kt, b, SUB_CHUNK, precision), v))
    if M_in is not None:
        o = o + einsum("...ck,...kv->...cv", r * jnp.exp(b), M_in)
    o = jnp.moveaxis(o, (0, 2), (1, 3)).reshape(B, N * chunk, H, dv)[:, :T]
    return o.astype(out_dtype), final


FORMS = {"chunked": chunked, "recurrent": recurrent}
