"""The mesa layer's memory (MesaNet): online ridge regression, solved afresh at every token.

The optimiser knob of the test-time-regression table set to "solve". After
token t the memory is the minimiser of

    sum_{i<=t} gamma_i^(t) ||v_i - W k_i||^2 + ||W Lambda^(1/2)||^2,   gamma_i^(t) = beta_i a_{i+1} ... a_t,

with data-dependent gates a_t, beta_t in (0, 1) and a fixed (undecayed)
Lambda = diag(lambda) > 0. Its read needs only two gated sums, each a
linear-attention state (key-major, as tmem.memory.linear_state):

    H_t = a_t H_{t-1} + beta_t k_t k_t^T    [d_k x d_k]
    G_t = a_t G_{t-1} + beta_t k_t v_t^T    [d_k x d_v]
    o_t = G_t^T (H_t + Lambda)^{-1} q_t.

`recurrent` is the definition and the oracle: the token loop with an exact
solve (LU, jnp.linalg.solve) at every token. Because Lambda is not decayed
with the sums, there is no rank-one recursion for (H_t + Lambda)^{-1}; the
Sherman-Morrison recursion of Derivation D5 holds only with every gate open
(a = beta = 1), where the read is recursive least squares (a test checks that).

`parallel` is the short sequences' training form: H_t for every t computed
at once (a masked matmul of each chunk's gated decays with its keys' outer
products, the state passed between chunks; at T <= chunk the masked
quadratic form with no loop), then the T systems solved side by side, with a
fixed number of conjugate-gradient steps (MesaNet's solver) or a batched
Cholesky factorisation, and G read by the chunked linear-attention form with
the solved x_t as queries. It holds T matrices d_k x d_k (with fewer reads
than a chunk's tokens, one for each read, from its row of its chunk's decays).
Its backward (tmem.memory.ridge_solve) contracts each solve's rank-one gradient
with the keys before it meets the sums, so it makes no matrix per token.
`chunked_cg` is the long sequences' (MesaNet's chunked conjugate gradient):
the same CG, each product H_t p_t made from the state entering t's chunk and
the chunk's gated keys, so it holds one matrix per chunk. The
conjugate-gradient solve, in either form, is differentiated implicitly: its
backward solves the adjoint system (the same matrix, symmetric) with the same
number of steps, so no iterate is stored.

Shapes, per batch b, time t, head h: q, k [B, T, H, d_k], v [B, T, H, d_v],
log_a and beta [B, T, H] (a scalar gate per head), lam [H, d_k] (positive),
state None or (H [B, H, d_k, d_k], G [B, H, d_k, d_v]). Math in float32;
`precision` is that of the matmuls (the oracle tests pass HIGHEST).
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp

from tmem.memory.chunked import chunked
from tmem.memory.reads import at_positions
from tmem.memory.ridge_solve import SOLVERS, cg, ridge_solve


def _f32(x):
    return None if x is None else jnp.asarray(x, jnp.float32)


def _ridge(H, lam):
    """H + Lambda: H [B, T or none, H, d, d] or [B, H, d, d], lam [H, d] on the diagonal."""
    d = lam.shape[-1]
    return H + (lam[..., :, None] * jnp.eye(d, dtype=H.dtype)[None]).reshape((1,) * (H.ndim - 3) + (-1, d, d))


def solve_sums(H, G, lam):
    """(H + Lambda)^-1 G [B, H, d_k, d_v]: the key-major matrix the read applies to every query, o = G^T (H +
    Lambda)^-1 q, from the final sums H [B, H, d_k, d_k], G [B, H, d_k, d_v] and lam [H, d_k]."""
    return jnp.linalg.solve(_ridge(_f32(H), _f32(lam)), _f32(G))


def recurrent(q, k, v, *, log_a, beta, lam, state=None, precision=None):
    """The definition: one token at a time, the sums updated and the ridge system solved exactly.

    Returns o [B, T, H, d_v] and the final state (H, G).
    """
    out_dtype = v.dtype
    q, k, v, log_a, beta, lam = map(_f32, (q, k, v, log_a, beta, lam))
    B, T, Hh, dk = k.shape
    if state is None:
        state = (jnp.zeros((B, Hh, dk, dk), jnp.float32), jnp.zeros((B, Hh, dk, v.shape[-1]), jnp.float32))
    einsum = partial(jnp.einsum, precision=precision)

    def step(carry, x):
        H, G = carry
        q_t, k_t, v_t, g_t, b_t = x  # [B, H, d], gates [B, H]
        a, b = jnp.exp(g_t)[..., None, None], b_t[..., None, None]
        H = a * H + b * einsum("bhk,bhl->bhkl", k_t, k_t)
        G = a * G + b * einsum("bhk,bhv->bhkv", k_t, v_t)
        x_t = jnp.linalg.solve(_ridge(H, lam), q_t[..., None])[..., 0]
        return (H, G), einsum("bhkv,bhk->bhv", G, x_t)

    time_major = lambda x: jnp.moveaxis(x, 1, 0)  # noqa: E731
    final, o = jax.lax.scan(step, tuple(map(_f32, state)), tuple(map(time_major, (q, k, v, log_a, beta))))
    return time_major(o).astype(out_dtype), final


def _layout(T: int, chunk: int) -> tuple[int, int]:
    """Chunks N and their length C: one chunk of T tokens when T fits in one."""
    N = math.ceil(T / chunk)
    return N, (chunk if N > 1 else T)


def _chunks(x, N: int, C: int):
    """[B, T, H, ...] -> [N, B, H, C, ...]; padding writes nothing (beta = 0, no decay)."""
    B, T, Hh = x.shape[:3]
    x = jnp.pad(x, [(0, 0), (0, N * C - T)] + [(0, 0)] * (x.ndim - 2))
    return jnp.moveaxis(x.reshape(B, N, C, Hh, *x.shape[3:]), (1, 3), (0, 2))


def _unchunk(x, T: int):
    """[N, B, H, C, ...] -> [B, T, H, ...], the padding dropped."""
    N, B, Hh, C = x.shape[:4]
    return jnp.moveaxis(x, (0, 2), (1, 3)).reshape(B, N * C, Hh, *x.shape[4:])[:, :T]


def _gates(log_a, beta, N: int, C: int):
    """Per chunk: the chunk-local cumulative log decay b [N, B, H, C] and the gated decays
    exp(b_t - b_j) beta_j for j <= t, else 0 [N, B, H, C, C] (masked before exp: no overflow, no NaN gradient)."""
    cum = jnp.cumsum(_chunks(log_a, N, C), axis=-1)
    causal = jnp.tril(jnp.ones((1, 1, 1, C, C), bool))
    decay = jnp.exp(jnp.where(causal, cum[..., :, None] - cum[..., None, :], -jnp.inf))
    return cum, decay * _chunks(beta, N, C)[..., None, :]


def _entry_states(k_c, u_c, cum, b, state, precision=None):
    """The state entering each chunk, S_in [N, B, H, d_k, d_u], and the final one: only these pass from chunk
    to chunk (a scan over T / C); none when one chunk starts from no state."""
    N, B, Hh = cum.shape[:3]
    if state is None and N == 1:
        return None, None
    einsum = partial(jnp.einsum, precision=precision)
    S0 = jnp.zeros((B, Hh, k_c.shape[-1], u_c.shape[-1]), jnp.float32) if state is None else state
    writes = einsum("...j,...jk,...ju->...ku", jnp.exp(cum[..., -1:] - cum) * b, k_c, u_c)

    def pass_state(S, x):
        write, a = x
        return a * S + write, S

    final, S_in = jax.lax.scan(pass_state, S0, (writes, jnp.exp(cum[..., -1])[..., None, None]))
    return S_in, final


@partial(jax.custom_vjp, nondiff_argnums=(0, 3, 4))
def _cg_solve(operator, op, b, steps: int, precision=None):
    """x ~ A^{-1} b by `steps` conjugate-gradient iterations, differentiated as the solve it approximates
    (implicit differentiation): db = A^{-1} dx by the same CG steps, and A's gradient -db x^T reaches `op` by
    the operator's pullback (of A x at x), whatever A is made of. Equal to the exact solve's gradient once CG
    has converged; no iterate is kept for the backward."""
    return cg(operator, op, b, steps, precision)


def _cg_fwd(operator, op, b, steps, precision):
    x = cg(operator, op, b, steps, precision)
    return x, (op, x)


def _cg_bwd(operator, steps, precision, residuals, dx):
    op, x = residuals
    db = cg(operator, op, dx, steps, precision)
    return operator[2](op, x, -db, precision), db


_cg_solve.defvjp(_cg_fwd, _cg_bwd)


def _chunk_apply(op, p, precision):
    """(H_t + Lambda) p_t at every token of every chunk, p [N, B, H, C, d], from op = (S_in, e^b, gated decays,
    k, lam): H_t p_t = e^{b_t} S_in p_t + sum_{j<=t} e^{b_t - b_j} beta_j k_j (k_j . p_t), two C x C matmuls
    and one with the chunk's entry state; no H_t is made."""
    S_in, e, decay, k_c, lam = op  # lam [1, 1, H, 1, d]
    einsum = partial(jnp.einsum, precision=precision)
    out = einsum("...tj,...jk->...tk", einsum("...tk,...jk->...tj", p, k_c) * decay, k_c) + lam * p
    return out if S_in is None else out + e[..., None] * einsum("...kl,...tl->...tk", S_in, p)


def _chunk_diagonal(op, precision):
    """The diagonal of every H_t + Lambda, [N, B, H, C, d]: the Jacobi guess's."""
    S_in, e, decay, k_c, lam = op
    diag = jnp.einsum("...tj,...jk->...tk", decay, k_c * k_c, precision=precision) + lam
    return diag if S_in is None else diag + e[..., None] * jnp.diagonal(S_in, axis1=-2, axis2=-1)[..., None, :]


def _chunk_pullback(op, x, dy, precision):
    return jax.vjp(lambda o: _chunk_apply(o, x, precision), op)[1](dy)[0]


CHUNKED = (_chunk_apply, _chunk_diagonal, _chunk_pullback)


def _key_chunks(k, log_a, beta, H0, N: int, C: int, precision=None):
    """What both training forms make of the keys: the keys in chunks, the chunk-local cumulative log decays and
    gated decays (`_gates`), the state entering each chunk (None for one chunk from no state) and the final H_T."""
    k_c = _chunks(k, N, C)
    cum, decay = _gates(log_a, beta, N, C)
    S_in, H_T = _entry_states(k_c, k_c, cum, _chunks(beta, N, C), H0, precision)
    if S_in is None:  # one chunk from no state: H_T is its last row's sum
        H_T = jnp.einsum("...j,...jk,...jl->...kl", decay[0, ..., -1, :], k_c[0], k_c[0], precision=precision)
    return k_c, cum, decay, S_in, H_T


def _only_at(q, read_at):
    """q [B, T, H, d] kept at the reads, zero elsewhere: the systems not read have no right-hand side."""
    B, T = q.shape[:2]
    return q * jnp.zeros((B, T), q.dtype).at[jnp.arange(B)[:, None], read_at].set(1)[..., None, None]


def _read_g(x, k, v, log_a, beta, G0, chunk, read_at, precision):
    """o = G_t^T x_t, by the chunked linear-attention form with the solutions x as queries, and G_T."""
    return chunked(x, k, v, log_a=log_a[..., None], beta=beta, state=G0, chunk=chunk, read_at=read_at,
                   precision=precision)


def parallel(q, k, v, *, log_a, beta, lam, state=None, solver: str = "cg", cg_steps: int = 30, chunk: int = 64,
             read_at=None, precision=None):
    """Same inputs and outputs as `recurrent`; equal to it once the solver has converged.

    solver: cg (cg_steps iterations, MesaNet's) | cholesky (exact, for small d_k).
    read_at [B, Q]: read only after these tokens, o [B, Q, H, d_v]; every token is still written.
    """
    if solver not in SOLVERS:
        raise ValueError(f"solver={solver!r} is not one of: {', '.join(SOLVERS)}")
    out_dtype = v.dtype
    q, k, v, log_a, beta, lam = map(_f32, (q, k, v, log_a, beta, lam))
    H0, G0 = (None, None) if state is None else tuple(map(_f32, state))
    B, T, Hh, dk = k.shape
    N, C = _layout(T, chunk)
    k_c, cum, decay, S_in, H_T = _key_chunks(k, log_a, beta, H0, N, C, precision)

    def solve(W, keys, rhs, e, S):  # lam [H, d_k] against the right sides, [N, B, H, C, d_k] or [B, H, Q, d_k]
        return ridge_solve(W, keys, rhs, lam.reshape((1,) * (rhs.ndim - 3) + (Hh, 1, dk)), e, S, solver, cg_steps,
                           precision)

    if read_at is None or read_at.shape[1] >= C:  # every token's system, in its chunk, from the chunk's state
        if read_at is not None:
            q = _only_at(q, read_at)
        e, S = (None, None) if S_in is None else (jnp.exp(cum), S_in[..., None, :, :])
        x = _unchunk(solve(decay, k_c, _chunks(q, N, C), e, S), T)
    else:  # fewer reads than a chunk's tokens: each read's row of its chunk's decays (zero in the others) alone
        n, i = read_at // C, read_at % C  # [B, Q]: each read's chunk and place in it
        rows = jnp.take_along_axis(decay, i[None, :, None, :, None], axis=3)  # [N, B, H, Q, C]
        rows = jnp.where((jnp.arange(N)[:, None, None] == n[None])[:, :, None, :, None], rows, 0.0)
        W = jnp.moveaxis(rows, 0, 3).reshape(B, Hh, -1, N * C)  # [B, H, Q, N C]
        e = S = None
        if S_in is not None:  # each read's chunk's entry state, decayed to it
            batch = jnp.arange(B)[:, None]
            S = jnp.moveaxis(jnp.moveaxis(S_in, 0, 1)[batch, n], 1, 2)  # [B, H, Q, d_k, d_k]
            e = jnp.moveaxis(jnp.exp(jnp.moveaxis(cum, (0, 3), (1, 2))[batch, n, i]), 1, 2)  # [B, H, Q]
        q_r = jnp.moveaxis(at_positions(q, read_at), 1, 2)
        x = solve(W, jnp.moveaxis(k_c, 0, 2).reshape(B, Hh, N * C, dk), q_r, e, S)  # [B, H, Q, d_k]
        # back in place for the chunked read, which takes the rows at read_at
        x = jnp.zeros(k.shape, x.dtype).at[jnp.arange(B)[:, None], read_at].set(jnp.moveaxis(x, 1, 2))
    o, G_T = _read_g(x, k, v, log_a, beta, G0, chunk, read_at, precision)
    return o.astype(out_dtype), (H_T, G_T)


def chunked_cg(q, k, v, *, log_a, beta, lam, state=None, cg_steps: int = 30, chunk: int = 64, read_at=None,
               precision=None):
    """Same inputs and outputs as `recurrent`, equal to it once CG has converged, in memory that holds one
    d_k x d_k matrix per chunk, not per token (MesaNet's chunked conjugate gradient).

    All T systems (H_t + Lambda) x_t = q_t are solved side by side by CG, each product H_t p_t made from its
    chunk's entry state and the chunk's gated keys (`_chunk_apply`). With read_at, only the rows read have a
    right-hand side (the others solve to zero), so the work is T's and the memory bounded either way.
    """
    out_dtype = v.dtype
    q, k, v, log_a, beta, lam = map(_f32, (q, k, v, log_a, beta, lam))
    H0, G0 = (None, None) if state is None else tuple(map(_f32, state))
    T = k.shape[1]
    N, C = _layout(T, chunk)
    k_c, cum, decay, S_in, H_T = _key_chunks(k, log_a, beta, H0, N, C, precision)
    if read_at is not None:
        q = _only_at(q, read_at)
    op = (S_in, None if S_in is None else jnp.exp(cum), decay, k_c, lam[None, None, :, None])
    x = _unchunk(_cg_solve(CHUNKED, op, _chunks(q, N, C), cg_steps, precision), T)
    o, G_T = _read_g(x, k, v, log_a, beta, G0, chunk, read_at, precision)
    return o.astype(out_dtype), (H_T, G_T)
