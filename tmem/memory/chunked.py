"""The chunked parallel form of the fast-weight write (tmem.memory.linear_state), which training uses.

Split the sequence into chunks of C tokens. Inside a chunk, with S the
(key-major) state entering it and b_i = g_1 + ... + g_i the chunk-local
cumulative log decay, the recurrence unrolls to (derivation in the docs;
fla's `naive_chunk_*` and the Gated DeltaNet paper give the same)

    S_i   = Diag(e^{b_i}) S + sum_{j <= i} Diag(e^{b_i - b_j}) k_j u_j^T
    o_i   = (q_i * e^{b_i})^T S + sum_{j <= i} A_ij u_j,   A_ij = sum_c q_ic k_jc e^{b_ic - b_jc}
    S_C   = Diag(e^{b_C}) S + sum_j (k_j * e^{b_C - b_j}) u_j^T

where u_j is what token j writes: beta_j v_j for the add and decay rows, and
for the delta rule the corrected value, which solves a unit lower-triangular
system (the UT transform of the WY representation):

    (I + L) U = diag(beta) V - diag(beta) (K * e^b) S,   L_ij = beta_i sum_c k_ic k_jc e^{b_ic - b_jc}, j < i
    U = T diag(beta) V - T diag(beta) (K * e^b) S,       T = (I + L)^{-1}.

So one chunk costs matmuls of size C, and only the state passes from chunk to
chunk (a lax.scan over T / C steps). Every exponent is a difference b_i - b_j
with j <= i, or b_C - b_j, or b_i: all <= 0, and the masked entries are set to
-inf before exp, so neither the values nor the gradients overflow; but for
a vector decay's scores through one reference, whose exponents are kept
within +-ONE_REFERENCE_SPAN (intra_scores).
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp

from tmem.memory.linear_state import prepare
from tmem.memory.reads import at_positions


def _lower(n: int, strict: bool = False) -> jax.Array:
    return jnp.tril(jnp.ones((n, n), bool), -1 if strict else 0)


# a vector decay's scores factor through one reference per channel while the chunk's log decay spans at most
# twice this: every factor's exponent is then within +-40, so neither it nor a masked product (e^80 at most)
# leaves float32's range
ONE_REFERENCE_SPAN = 40.0


def intra_scores(x, k, b, sub_chunk: int, precision=None):
    """A_ij = sum_c x_ic k_jc exp(b_ic - b_jc) for j <= i, else 0.

    x, k [..., C, d_k], b None (no decay) or [..., C, G] with G = 1 (a scalar decay: a masked
    matmul) or G = d_k (a vector decay); x and k may have a head axis of 1 that b's broadcasts (a q and k
    shared by the heads: their products made once). A vector decay has no single C x C decay matrix; while
    no channel decays by more than e^-80 in the chunk, the scores are one matmul through a reference per
    channel (`one_reference_scores`), else they are taken in sub-chunks of c tokens (`sub_chunk_scores`).
    """
    einsum = partial(jnp.einsum, precision=precision)
    C = x.shape[-2]
    if b is None:  # no decay: a masked matmul
        return jnp.where(_lower(C), einsum("...ik,...jk->...ij", x, k), 0.0)
    if b.shape[-1] == 1:
        diff = b[..., :, None, 0] - b[..., None, :, 0]
        decay = jnp.exp(jnp.where(_lower(C), diff, -jnp.inf))
        return einsum("...ik,...jk->...ij", x, k) * decay
    return vector_scores(x, k, b, sub_chunk, precision)


def _vector_forms(sub_chunk, precision):
    return (partial(one_reference_scores, precision=precision),
            partial(sub_chunk_scores, sub_chunk=sub_chunk, precision=precision))


@partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def vector_scores(x, k, b, sub_chunk, precision=None):
    """intra_scores for a vector decay: one reference where it fits every channel of every chunk, else sub-chunks.

    Its backward runs only the form the forward took, from x, k and b: autodiff through a lax.cond would keep
    the residuals of both forms (the other's as zeros), which cost GLA's training step about a tenth."""
    return _vector_scores_fwd(x, k, b, sub_chunk, precision)[0]


def _vector_scores_fwd(x, k, b, sub_chunk, precision):
    fits = jnp.max(jnp.max(b, axis=-2) - jnp.min(b, axis=-2)) <= 2 * ONE_REFERENCE_SPAN
    return jax.lax.cond(fits, *_vector_forms(sub_chunk, precision), x, k, b), (x, k, b, fits)


def _vector_scores_bwd(sub_chunk, precision, residuals, d_scores):
    x, k, b, fits = residuals
    return jax.lax.cond(fits, *[lambda form=form: jax.vjp(form, x, k, b)[1](d_scores)
                                for form in _vector_forms(sub_chunk, precision)])


vector_scores.defvjp(_vector_scores_fwd, _vector_scores_bwd)


def one_reference_scores(x, k, b, precision=None):
    """intra_scores for a vector decay as one matmul: e^{b_i - b_j} = e^{b_i - m} e^{m - b_j}, with m each
    channel's midpoint between its largest and smallest b in the chunk. Exact while the chunk's log decay spans at
    most 2 ONE_REFERENCE_SPAN in every channel (intra_scores checks); the clip keeps the factors finite where it
    does not (a vmapped intra_scores computes both of its forms)."""
    b_ = jax.lax.stop_gradient(b)  # m's gradient would cancel in each product
    m = (jnp.max(b_, axis=-2, keepdims=True) + jnp.min(b_, axis=-2, keepdims=True)) / 2
    to_m = jnp.exp(jnp.minimum(b - m, ONE_REFERENCE_SPAN))
    from_m = jnp.exp(jnp.minimum(m - b, ONE_REFERENCE_SPAN))
    scores = jnp.einsum("...ik,...jk->...ij", x * to_m, k * from_m, precision=precision)
    return jnp.where(_lower(x.shape[-2]), scores, 0.0)


def sub_chunk_scores(x, k, b, sub_chunk: int, precision=None):
    """intra_scores for a vector decay of any span, in sub-chunks of c tokens (the largest divisor of C up to
    sub_chunk): a block of keys before the query block factors through the query block's first row and the key
    block's last, each factor's exponent <= 0; a diagonal block keeps all c x c x d_k decays (the per-channel
    form, c d_k exps per token)."""
    einsum = partial(jnp.einsum, precision=precision)
    C = x.shape[-2]
    c = max(d for d in range(1, min(sub_chunk, C) + 1) if C % d == 0)
    n = C // c
    blocks = lambda y: y.reshape(*y.shape[:-2], n, c, y.shape[-1])  # noqa: E731
    xs, ks, bs = blocks(x), blocks(k), blocks(b)
    diff = bs[..., :, None, :] - bs[..., None, :, :]  # [..., n, c, c, d_k]
    on_block = einsum("...nik,...njk,...nijk->...nij", xs, ks,
                      jnp.exp(jnp.where(_lower(c)[..., None], diff, -jnp.inf)))
    # key block J before query block I: e^{b_i - b_j} = e^{b_i - r_I} e^{r_I - e_J} e^{e_J - b_j}, with r_I the
    # first row of block I and e_J the last of block J, so every factor is <= 1 and the exps are few
    ref, end = bs[..., :, :1, :], bs[..., :, -1:, :]
    x_ref = xs * jnp.exp(bs - ref)
    k_end = ks * jnp.exp(end - bs)
    before = _lower(n, strict=True)[..., None]  # [I, J, 1]: J strictly before I
    between = jnp.exp(jnp.where(before, ref[..., :, None, 0, :] - end[..., None, :, 0, :], -jnp.inf))  # [..., I, J, d_k]
    k_ref = k_end[..., None, :, :, :] * between[..., :, :, None, :]
    off_block = einsum("...Iik,...IJjk->...IiJj", x_ref, k_ref)
    full = off_block + einsum("...Iij,IJ->...IiJj", on_block, jnp.eye(n, dtype=on_block.dtype))
    return full.reshape(*full.shape[:-4], C, C)  # x and k may broadcast against b (q and k shared by the heads)


def _times(x, factor):
    return x if factor is None else x * factor


def unit_lower_inverse(L, base: int = 8, precision=None):
    """(I + L)^{-1} for the strictly lower triangle of L [..., C, C] (what is on and above its diagonal is not
    read), by blocks.

    Diagonal blocks of `base` rows are inverted by forward substitution (rows
    unrolled, all blocks at once); then inverses of the diagonal blocks double
    in size each round, [[A, 0], [X, D]]^{-1} = [[A^{-1}, 0], [-D^{-1} X A^{-1}, D^{-1}]],
    with batched matmuls. XLA's batched triangular solve on CPU is ~20x slower
    here when multithreaded, and a product of matmuls differentiates without a solve.
    """
    einsum = partial(jnp.einsum, precision=precision)
    C = L.shape[-1]
    P = max(base, 1 << (C - 1).bit_length())  # pad to a power of two with an identity block
    M = jnp.pad(L, [(0, 0)] * (L.ndim - 2) + [(0, P - C), (0, P - C)])
    batch = M.shape[:-2]

    def diagonal_blocks(size):  # [..., P / size, size, size]
        n = P // size
        return jnp.moveaxis(jnp.diagonal(M.reshape(*batch, n, size, n, size), axis1=-4, axis2=-2), -1, -3)

    blocks = diagonal_blocks(base)
    eye = jnp.broadcast_to(jnp.eye(base, dtype=L.dtype), blocks.shape)
    rows = [eye[..., 0, :]]
    for i in range(1, base):  # row i of the inverse: e_i - sum_{j<i} L_ij (row j)
        rows.append(eye[..., i, :] - einsum("...j,...jk->...k", blocks[..., i, :i], jnp.stack(rows, -2)))
    inv = jnp.stack(rows, -2)
    s = base
    while s < P:
        X = diagonal_blocks(2 * s)[..., s:, :s]
        A_inv, D_inv = inv[..., 0::2, :, :], inv[..., 1::2, :, :]
        lower_left = -einsum("...ij,...jk->...ik", D_inv, einsum("...ij,...jk->...ik", X, A_inv))
        top = jnp.concatenate([A_inv, jnp.zeros_like(A_inv)], axis=-1)
        inv = jnp.concatenate([top, jnp.concatenate([lower_left, D_inv], axis=-1)], axis=-2)
        s *= 2
    return inv[..., 0, :C, :C]


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def unit_lower_solve(L, R, precision=None):
    """(I + L)^{-1} R for the strictly lower triangle of L [..., C, C] (the rest is not read) and R [..., C, d].

    Its backward is the solve's own, two matmuls with the inverse the forward
    kept (dR = (I + L)^{-T} dU, dL = -dR U^T below the diagonal), not autodiff
    through the inverse's many small steps: inside a CPU training step at
    C = 64 those took more time than everything else in the delta rule.
    """
    return jnp.einsum("...ij,...jd->...id", unit_lower_inverse(L, precision=precision), R, precision=precision)


def _solve_fwd(L, R, precision):
    inverse = unit_lower_inverse(L, precision=precision)
    U = jnp.einsum("...ij,...jd->...id", inverse, R, precision=precision)
    return U, (inverse, U)


def _solve_bwd(precision, residuals, dU):
    inverse, U = residuals
    dR = jnp.einsum("...ji,...jd->...id", inverse, dU, precision=precision)
    dL = -jnp.einsum("...id,...jd->...ij", dR, U, precision=precision)
    return jnp.where(_lower(U.shape[-2], strict=True), dL, 0.0), dR


unit_lower_solve.defvjp(_solve_fwd, _solve_bwd)


def chunked(q, k, v, *, log_a=None, beta=None, delta: bool = False, state=None,
            chunk: int = 64, sub_chunk: int = 16, read_at=None, precision=None):
    """Same inputs and outputs as `linear_state.recurrent`; equal to it up to float rounding.

    chunk: tokens per chunk (any positive size; the sequence is padded with
    tokens that neither write nor decay). sub_chunk: the largest block a vector decay too strong for one
    reference keeps per channel (the largest divisor of chunk up to it is used; see intra_scores).
    read_at [B, Q]: read only after these tokens, o [B, Q, H, d_v] (every token is still written).
    precision: that of the matmuls (None: the backend's default, TF32 on recent GPUs).
    """
    einsum = partial(jnp.einsum, precision=precision)
    out_dtype = v.dtype
    decays, strengths, empty = log_a is not None, beta is not None, state is None
    q, k, v, log_a, beta, state = prepare(q, k, v, log_a, beta, state)
    B, T, H, _ = v.shape
    N = math.ceil(T / chunk)
    pad = N * chunk - T

    # chunk-major [N, B, H, C, ...]: the scan over chunks reads and writes its leading axis in place, and
    # every matmul has its batch axes first (with the matmul cumsum below: linear row 212 -> 147 ms, BENCHMARKS.md)
    def chunks(x):  # [B, T, H, ...] -> [N, B, H, C, ...]; padding writes nothing (k = v = beta = 0, g = 0)
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        # a decay shared by the batch keeps its axis of 1, and so do a q and k shared by the heads: their scores
        # are made once and broadcast against each head's decay and values
        x = x.reshape(x.shape[0], N, chunk, x.shape[2], *x.shape[3:])
        return jnp.moveaxis(x, (1, 3), (0, 2))

    q_read = None if read_at is None else at_positions(q, read_at)
    q, k, v, g, beta = map(chunks, (q, k, v, log_a, beta))
    if decays:
        # chunk-local cumulative log decay (no global sum to lose precision), as a matmul with a triangle of
        # ones: XLA's cumsum on a CPU is a reduce-window several times slower. Always in full float32: TF32's
        # 10-bit mantissa would put an error of ~1e-3 of the chunk's total log decay into every decay factor
        b = jnp.einsum("ij,...jg->...ig", _lower(chunk).astype(g.dtype), g, precision=jax.lax.Precision.HIGHEST)
        b_end = b[..., -1:, :]
        to_start, to_end, across = jnp.exp(b), jnp.exp(b_end - b), jnp.exp(b_end[..., 0, :])[..., None]
    else:  # linear attention, DeltaNet: every decay factor is 1, and none is computed (XLA does not fold them)
        b = to_start = to_end = across = None
    k_to_end = _times(k, to_end)
    u = beta[..., None] * v if strengths else v
    from_state = not (empty and N == 1)  # else nothing reads the state entering a chunk: it is zero
    if delta:
        k_beta = beta[..., None] * k  # L_ij = beta_i k_i . k_j: beta's gradient then sums d_k channels, not C keys
        # the solve reads L below the diagonal only, so L takes the read's mask: one kind of scores, one mask
        L = intra_scores(k_beta, k, b, sub_chunk, precision=precision)
        rhs = jnp.concatenate([u, _times(k_beta, to_start)], axis=-1) if from_state else u
        solved = unit_lower_solve(L, rhs, precision)
        u, w = solved[..., : v.shape[-1]], solved[..., v.shape[-1]:]

    def pass_state(S, x):
        if delta:
            u_n, k_n, across_n, w_n = x
            u_n = u_n - einsum("...ck,...kv->...cv", w_n, S)
            write = einsum("...ck,...cv->...kv", k_n, u_n)
        else:
            u_n, write, across_n = x
        return _times(S, across_n) + write, (S, u_n)

    if not from_state:  # one chunk from an empty state: the quadratic form alone, without a loop around it
        final, S_in = einsum("...ck,...cv->...kv", k_to_end[0], u[0]), None
    else:
        if delta:
            xs = (u, k_to_end, across, w)
        else:  # what each chunk writes does not depend on the state: all chunks at once, outside the scan
            xs = (u, einsum("...ck,...cv->...kv", k_to_end, u), across)
        if N == 1:
            final, (S_in, u) = pass_state(state, jax.tree.map(lambda x: x[0], xs))
            S_in, u = S_in[None], u[None]
        else:
            final, (S_in, u) = jax.lax.scan(pass_state, state, xs)
    if read_at is not None:
        return _read_at(q_read, k, u, b, S_in, read_at, chunk, precision).astype(out_dtype), final
    o = einsum("...ij,...jv->...iv", intra_scores(q, k, b, sub_chunk, precision=precision), u)
    if S_in is not None:
        o = o + einsum("...ck,...kv->...cv", _times(q, to_start), S_in)
    o = jnp.moveaxis(o, (0, 2), (1, 3)).reshape(B, N * chunk, H, -1)[:, :T]
    return o.astype(out_dtype), final


def _read_at(q, k, u, b, S_in, read_at, chunk: int, precision=None):
    """The chunked read after tokens p = read_at [B, Q] only, from the chunk-major parts of `chunked`:

        o_p = (q_p * e^{b_p})^T S_in[n] + sum_{j <= p in chunk n} (q_p . (k_j * e^{b_p - b_j})) u_j,   n = p // C,

    so reading Q positions costs Q rows of scores, not T (a last layer scored at a few positions).
    q [B, Q, H, d_k]; k, u, b [N, B, H, C, ...]; S_in [N, B, H, d_k, d_v] or None (zero).
    """
    einsum = partial(jnp.einsum, precision=precision)
    n, i = read_at // chunk, read_at % chunk
    rows = jnp.arange(read_at.shape[0])[:, None]
    one = k.shape[0] == 1  # every read is in the only chunk: its keys serve all reads, and nothing is gathered

    def chunk_of(x):  # the read's chunk: [B, Q, H, C, ...], or [B, 1, H, C, ...] shared by the reads
        return x[0][:, None] if one else x[n, rows if x.shape[1] > 1 else 0]  # a shared decay: its one example

    r = "x" if one else "q"  # the axis chunk_of leaves for the reads
    k_n, u_n = chunk_of(k), chunk_of(u)
    visible = jnp.arange(chunk)[None, None, None] <= i[..., None, None]  # [B, Q, 1, C]: keys up to the read
    if b is None:
        scores = jnp.where(visible, einsum(f"bqhk,b{r}hjk->bqhj", q, k_n), 0.0)
    else:
        b_n = chunk_of(b)  # [B, Q or 1, H, C, G]
        b_p = jnp.take_along_axis(b_n, i[:, :, None, None, None], axis=3)  # [B, Q, H, 1, G]
        decay = jnp.exp(jnp.where(visible[..., None], b_p - b_n, -jnp.inf))
        if b.shape[-1] == 1:
            scores = einsum(f"bqhk,b{r}hjk->bqhj", q, k_n) * decay[..., 0]
        else:
            scores = einsum(f"bqhk,b{r}hjk,bqhjk->bqhj", q, k_n, decay)
    o = einsum(f"bqhj,b{r}hjv->bqhv", scores, u_n)
    if S_in is not None:
        q_start = q if b is None else q * jnp.exp(b_p[..., 0, :])
        o = o + einsum(f"bqhk,b{r}hkv->bqhv", q_start, chunk_of(S_in))
    return o
