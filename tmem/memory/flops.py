"""FLOPs of the memories, forward and backward, as XLA's CPU cost analysis counts them: the fast-weight memory's
chunked form (tmem.memory.chunked) and recurrent one (tmem.memory.linear_state.recurrent), TTT-Linear's dual form
(tmem.memory.ttt) and the gradient memory of TTT-MLP and Titans (tmem.memory.gradient): the memory's part of
tmem.flops' count of a training step. Mesa's (tmem.memory.mesa) are in flops_mesa.py beside this, built on the
costs here.

A matmul [m, k] x [k, n] is 2mkn, and 2mkn more for each operand's gradient;
an elementwise op is 1 FLOP an element (exp and other transcendentals, which
XLA reports apart, count 0); composite ops carry their measured
(forward, backward) costs per element. The memories trained in the forward
pass (TTT's and Titans') take a gradient inside the forward, which the step
differentiates again, and XLA fuses a cheap elementwise producer there into
every fusion that reads it:
their elementwise terms are what XLA counts for each line of that code,
copies included, measured per element on the default job's shapes (the
matmuls, 75 to 90% of those memories, are exact). With mini-batches of 8
tokens or fewer XLA makes more copies, and counts these memories 3 to 16%
above this count (memory alone, measured at mini_batch 8, 4 and 1).
"""

from __future__ import annotations

import math

from tmem.memory.gradient import UNROLLED

# products and differences: both operands' gradients; one broadcast (beta v, b_i - b_j) sums its gradient too
PRODUCT, SCALED, DIFFERENCE = (1, 2), (1, 3), (1, 3)
# a vector decay's scores through one reference, per element of q (C x d_k a chunk), forward and backward: the
# check that the decays fit and the midpoint (max, min), b - m and m - b clipped, both products, and the
# backward's recomputation and gradients of them; fitted to XLA's count over C 8-128, d_k 8-64 (within 3%)
ONE_REFERENCE = 38


def matmul(m: int, k: int, n: int, grads: int = 2) -> int:
    """[m, k] x [k, n] forward (2mkn) and backward: 2mkn for each of `grads` operands that need a gradient."""
    return 2 * m * k * n * (1 + grads)


def matvec(rows: int, m: int, n: int) -> int:
    """rows of an [m, n] matrix times a vector (one per row): forward 2mn, the vector's gradient 2mn, the
    matrix's mn (an outer product, one product per element, which XLA runs as a multiply, not a matmul)."""
    return 5 * rows * m * n


def elementwise(n: int, cost: tuple[int, ...], grad: bool = True) -> int:
    """n elements of an op costing (forward, backward) per element; no backward without a gradient."""
    return n * (cost[0] + (cost[1] if grad else 0))


def chunked(BH: int, T: int, dk: int, dv: int, decay: int | None, decay_grad: bool, strengths: bool,
            delta: bool, chunk: int, reads: int | None, once: bool = False,
            decay_heads: int | None = None, qk_heads: int = 1) -> int:
    """tmem.memory.chunked.chunked for BH heads of T tokens, from an empty state as training starts.

    decay: None, or the width G of the log decay (1 for a scalar, dk for a vector); decay_grad: whether it
    trains (RetNet's is fixed); decay_heads: the heads its factors are made for, when fewer than BH (RetNet's is
    shared by the batch: its H heads); qk_heads: the heads one q and k serve (H for Mamba-2's one group, whose
    scores are made once for its heads and their gradients summed back). reads: None (every position) or the
    number of (example, read, head) rows `_read_at` reads. The state passes through a scan over chunks only
    when there are several (once: count one step of it, as XLA does); with one chunk nothing reads it, and the
    quadratic form is all.
    """
    N = math.ceil(T / chunk)
    C, chunks, rows = chunk, BH * N, BH * N * chunk
    from_state = N > 1
    by_decay = (SCALED if decay == 1 else PRODUCT) if decay else (0, 0)  # x * exp(b), b broadcast if scalar
    flops = 0
    decay_chunks = (decay_heads or BH) * N
    if decay:  # b = tril(1) @ g, a gradient for g only; from chunk to chunk, k * exp(b_C - b)
        flops += matmul(decay_chunks * C, C, decay, grads=int(decay_grad))
        if from_state:
            flops += elementwise(decay_chunks * C * decay, (1, 1), decay_grad) + elementwise(rows * dk, by_decay)
    if strengths:
        flops += elementwise(rows * dv, SCALED)  # u = beta v
    if delta:  # L = (beta k) k^T strictly below the diagonal; U = (I + L)^{-1} rhs, rhs = [u, (beta k) e^b]
        flops += (intra_scores(chunks, C, dk, decay, decay_grad, decay_chunks, qk_heads)
                  + elementwise(rows * dk, SCALED))
        if from_state:
            flops += elementwise(rows * dk, by_decay)
        # the inverse has no backward: unit_lower_solve's is two matmuls with the inverse it kept, and a mask
        flops += chunks * unit_lower_inverse(C) + matmul(rows, C, dv + dk * from_state) + 2 * chunks * C * C
    elif from_state:  # every chunk's write k^T u at once, outside the scan
        flops += matmul(BH * N * dk, C, dv)
    if from_state:
        flops += (1 if once else N) * state_pass(BH, C, dk, dv, decay, delta)
    if reads is None:
        flops += (intra_scores(chunks, C, dk, decay, decay_grad, decay_chunks, qk_heads)
                  + matmul(rows, C, dv))
        if from_state:  # + (q e^b) S_in
            flops += elementwise(rows * dk, by_decay) + matmul(rows, dk, dv) + rows * dv
        return flops
    return flops + read_at(reads, C, dk, dv, decay, from_state, qk_heads)


def recurrent(BH: int, T: int, dk: int, dv: int, decay: int | None, decay_grad: bool, strengths: bool,
              delta: bool, reads: int | None, once: bool = False) -> int:
    """tmem.memory.linear_state.recurrent for BH heads of T tokens: a scan over the tokens (once: count one step
    of it, as XLA does), each step decaying, writing and reading the state, forward and backward.

    decay, decay_grad, strengths and delta as for `chunked`. reads: None, or the number of (example, read, head)
    rows the layer keeps: the scan reads at every position all the same, and the rows are gathered after it
    (tmem.mixers.base.at_positions), whose backward scatter-adds their gradients back.
    """
    flops = (1 if once else T) * token_step(BH, dk, dv, decay, decay_grad, strengths, delta)
    return flops if reads is None else flops + reads * dv


def token_step(BH: int, dk: int, dv: int, decay: int | None, decay_grad: bool, strengths: bool,
               delta: bool) -> int:
    """One step of the scan of `recurrent`, forward and backward, on BH states S of dk x dv: S' = a S, then
    S' + beta k v^T (add) or S' + beta k (v - S'^T k)^T (delta), read S^T q.

    Without a decay or a strength the forward's a = exp(0) and beta = 1 are constants XLA folds away, but the
    backward still multiplies by the ones the forward saved for it (a into the state's gradient, beta into the
    keys' and values'), so those products count whether or not there is a decay or strength. Each op counts
    once: XLA's CPU fusion of this step computes some products twice or more and counts every copy
    (tests/test_flops.py lists them).
    """
    E, K, V = BH * dk * dv, BH * dk, BH * dv  # one FLOP for every element of the state, of a key, of a value
    # the read o = S^T q, its two gradients, and q do^T added to the gradient the state carries back
    flops = matvec(BH, dk, dv) + E
    if delta:
        # forward: S'^T k, e = v - S'^T k, and (beta k) e^T added to S'
        flops += 2 * E + V + 2 * E
        # backward: the gradients of beta k and of e (the state's gradient times e, and times beta k), k (-de)^T
        # added to the state's gradient, S' (-de) into k's gradient, and beta times beta k's gradient added to it
        flops += 2 * E + 2 * E + V + 2 * E + 2 * E + 2 * K
        if strengths:  # beta k, and beta's gradient: the product with k and its sum
            flops += K + 2 * K
    else:
        # forward: k v^T added to S'; backward: beta times the state's gradient, and its products with v and k summed
        flops += 2 * E + E + 4 * E
        if strengths:  # beta times k v^T, and beta's gradient: the product with k v^T and its sum
            flops += E + 2 * E
    flops += E  # a times the state's gradient (the scan carries it back to the previous step)
    if decay:  # a S; the decay's gradient: S times the state's gradient summed to a's shape, then times a
        flops += E + (2 * E + BH * decay if decay_grad else 0)
    return flops


def state_pass(BH: int, C: int, dk: int, dv: int, decay: int | None, delta: bool) -> int:
    """One step of the scan over chunks (forward and backward): the delta rule's u - w S and write k^T u,
    then S e^{b_C} + write."""
    flops = BH * dk * dv * (1 + (sum(SCALED) if decay else 0))
    if delta:
        flops += matmul(BH * C, dk, dv) + elementwise(BH * C * dv, (1, 1)) + matmul(BH * dk, C, dv)
    return flops


def read_at(R: int, C: int, dk: int, dv: int, decay: int | None, from_state: bool, qk_heads: int = 1) -> int:
    """tmem.memory.chunked._read_at for R (example, read, head) rows: one row of scores against the read's
    chunk (one for each qk_heads heads that share q and k, its gradient summed over them). Backward, the
    gathered keys, values, decays (and state) have their gradients scattered back."""
    flops = matvec(R // qk_heads, C, dk) + (R - R // qk_heads) * C  # scores
    flops += matvec(R, C, dv) + R * C * (dk + dv) + R * dk  # read, scatters
    if decay:  # exp(where(visible, b_p - b_j)): sub, select and their gradients, b_p's and b_j's scattered
        flops += 6 * R * C * decay
        flops += elementwise(R * C * (dk if decay > 1 else 1), PRODUCT)  # k_j * decay, or scores * decay
    else:
        flops += elementwise(R * C, (1, 1))  # where(visible, scores, 0)
    if from_state:
        flops += matvec(R, dk, dv) + R * dv + R * dk * dv + (elementwise(R * dk, PRODUCT) if decay else 0)
    return flops


def intra_scores(chunks: int, C: int, dk: int, decay: int | None, decay_grad: bool,
                 decay_chunks: int | None = None, qk_heads: int = 1) -> int:
    """tmem.memory.chunked.intra_scores for `chunks` chunks of C tokens: masked q k^T (made once for each
    qk_heads heads that share q and k, and its gradient summed over them), times the decays (made for
    `decay_chunks` of them, when a decay is shared by the batch). A vector decay is counted in the form training
    takes, one reference per channel; its sub-chunks (for decays too strong for one) are not counted."""
    where = elementwise(chunks * C * C, (1, 1))
    scores = matmul(chunks // qk_heads * C, dk, C) + (chunks - chunks // qk_heads) * C * C
    if decay is None:
        return scores + where
    if decay == 1:  # exp(where(mask, b_i - b_j)) * (q k^T); no gradient into a fixed decay
        made = (decay_chunks or chunks) * C * C
        diff = elementwise(made, DIFFERENCE, decay_grad) + (elementwise(made, (1, 1)) if decay_grad else made)
        return scores + diff + elementwise(chunks * C * C, PRODUCT if decay_grad else (1, 1))
    return scores + where + chunks * C * dk * ONE_REFERENCE


def unit_lower_inverse(C: int, base: int = 8) -> int:
    """Forward FLOPs of tmem.memory.chunked.unit_lower_inverse for one C x C matrix (padded to a power of two):
    forward substitution inside blocks of `base` rows, then blocks doubling. Its gradient is never taken:
    unit_lower_solve's backward uses the inverse it kept."""
    P = max(base, 1 << (C - 1).bit_length())
    flops = (P // base) * sum(2 * i * base + base for i in range(1, base))
    s = base
    while s < P:
        flops += (P // (2 * s)) * (2 * 2 * s**3 + s * s)
        s *= 2
    return flops


def cumsum(n: int) -> int:
    """jnp.cumsum along n elements (one row), as XLA's CPU backend rewrites its reduce-window: n (n - 1) up to 16,
    else a sum within each block of 16 (16 FLOPs an element, padded to whole blocks, the offsets' adds included)
    and the cumulative sum of the m block totals (measured: 1039 for n = 64, 4351 for n = 256)."""
    if n <= 16:
        return n * (n - 1)
    m = -(-n // 16)
    return 256 * m + (m * m - 1 if m <= 16 else cumsum(m))


# TTT's inner LayerNorm, per element of its input: (forward, backward with the scale's and bias's gradients), as
# tmem.memory.ttt.layer_norm; and the inner loss's gradient G = LN'(z)^T (LN(z) - target) that ttt._ln_with_vjp
# writes out, forward, and backward through it (to z, the target, the scale and the bias): measured at d = 64, a
# few FLOPs a row more at d = 16
TTT_LN, TTT_INNER_GRAD = (7, 14), (16, 34)


def ttt_dual(BH: int, T: int, d: int, b: int, once: bool = False) -> int:
    """tmem.memory.ttt.dual for BH heads of T tokens in mini-batches of b, forward and backward, from the initial
    state: every mini-batch's reads, and between mini-batches (a scan over all but the last: once, count one
    step of it, as XLA does) the writes that close each."""
    n = math.ceil(T / b)
    steps = min(n - 1, 1) if once else n - 1
    P, S = BH * n * b * d, BH * n * b * b  # all mini-batches' token elements, and their b x b scores
    # outside the loop, for all mini-batches at once: eta = tok_i lr_j below the diagonal (two products, which
    # XLA makes again in each fusion that reads eta) and lr's and tok's gradients, summed; with several
    # mini-batches, the gradients of the last one's slice and the others' added (q, k, v and eta)
    outside = S * (10 + 2 * (n > 1)) + ((3 * P + S) if n > 1 else 0)
    weights = 5 * BH * (d * d + d)  # W_0 and b_0 broadcast over the batch: their gradients summed
    return steps * ttt_step(BH, b, d) + ttt_read(BH, b, d) + outside + weights


def ttt_read(BH: int, b: int, d: int) -> int:
    """One mini-batch of tmem.memory.ttt.dual's reads for BH heads, forward and backward: z = k W + b and the
    inner loss's gradient G there, then z_bar = q W + b - tok (q dW + db) - (eta (q k^T + 1)) G and q + LN(z_bar).

    Nothing folds the state's zero change dW, db: q dW and its gradient to q count like the other matmuls.
    """
    rows = BH * b
    P, S = rows * d, rows * b
    # k W, q W, q dW (dW a constant: no gradient); q k^T; the scores times G
    flops = 2 * matmul(rows, d, d) + matmul(rows, d, d, grads=1) + matmul(rows, d, b) + matmul(rows, b, d)
    flops += elementwise(P, TTT_INNER_GRAD) + elementwise(P, TTT_LN)
    # per token element: + b (z), v - k, + b, + db, tok times, minus both, q + LN: 7 forward; backward, b's
    # gradient summed (twice), -dt into k, tok's gradient (product, sum), the gradients added into k and q, and
    # the copies XLA makes of cheap producers
    flops += P * 23
    return flops + S * 6  # (q . k + 1) eta; backward, eta's and q . k's gradients


def ttt_step(BH: int, b: int, d: int) -> int:
    """One step of tmem.memory.ttt.dual's scan for BH heads, forward and backward: a mini-batch's reads, its
    writes sum_j lr_j k_j G_j^T into dW and lr . G into db, and the close W - tok_b dW, b - tok_b db."""
    return ttt_read(BH, b, d) + matmul(BH * d, b, d) + BH * b * d * 7 + BH * (d * d + d) * 7


# GELU (the tanh form, the MLPs' and the gradient memory's reads) per element, forward and backward
GELU = (8, 15)
# the gradient memory's keys' pass (tmem.memory.key_gradients) per element, forward and its written-out backward,
# without and with biases (XLA copies the bias's add into each fusion that reads z): a hidden unit's GELU, its
# two derivatives and delta = (delta_out W_out^T) GELU'(z); the output's LayerNormed residual and its delta.
# Fitted to XLA's count of the pass alone over b 8-16, d 16-32 and hidden 32-128 (within 1.5%)
KEYS_HIDDEN, KEYS_NORM = (42, 45), (153, 166)


def gradient_memory(BH: int, T: int, b: int | None, widths: list[int], bias: bool, norm: bool, tok: bool,
                    decay_grad: bool, momentum: bool, once: bool = False, reads: int | None = None) -> int:
    """tmem.memory.gradient.parallel for BH heads of T tokens, forward and backward, from the initial state, in
    mini-batches of b tokens (None: one of all T): each mini-batch's reads (`gradient_block`), and but for the last
    its writes (`inner_write`); the first reads the initial model and no momentum. Up to gradient.UNROLLED
    mini-batches each is its own code; beyond, the first and last are outside a scan over the others (once: count
    one step of it, as XLA does).

    widths: the inner model's [d, d] (x W1 + b1) or [d, hidden, d] (GELU(x W1 + b1) W2 + b2); bias, norm (x +
    LN(g(x)), target v - k), tok (TTT's factor of the reading position), decay_grad (the memory decays by a rate
    from the token; a fixed decay, or none, still has its factors made) and momentum: as tmem.memory.gradient.
    reads: the positions read (read_at's Q), which every mini-batch reads in place of its own b queries, each
    kept where it is its own (a select) and summed over the n mini-batches, the queries' gradient summed back.
    """
    b = b or T
    n = math.ceil(T / b)
    middle = max(n - 2, 0)
    steps = min(middle, 1) if once and n > UNROLLED else middle
    options = bias, norm, tok, decay_grad, momentum
    flops = steps * gradient_step(b, widths, *options, queries=reads)
    if n > 1:  # the first mini-batch, which closes; the gradients of the slices taken for each part added (q, k,
        # v and the rates)
        flops += gradient_step(b, widths, *options, first=True, queries=reads) + 2 * T * (3 * widths[0] + 3)
    flops += gradient_block(b, widths, *options, first=n == 1, queries=reads)  # the last: its state is not read
    if reads is not None:
        flops += n * reads * widths[-1] * 4  # the select and the sum over mini-batches, and their gradients
    weights = sum(a * c + c * bias for a, c in zip(widths, widths[1:]))
    return BH * (flops + weights)  # and the initial memory's gradient, summed over the batch


def gradient_step(b: int, widths: list[int], bias: bool, norm: bool, tok: bool, decay_grad: bool,
                  momentum: bool, first: bool = False, queries: int | None = None) -> int:
    """One mini-batch of one head that closes, as each step of tmem.memory.gradient.parallel's scan: its reads and
    its writes, forward and backward. first: the first from the initial model, which has no momentum yet."""
    return (gradient_block(b, widths, bias, norm, tok, decay_grad, momentum, first, queries)
            + inner_write(b, widths, bias, momentum, carried=momentum and not first))


def gradient_block(b: int, widths: list[int], bias: bool, norm: bool, tok: bool, decay_grad: bool,
                   momentum: bool, first: bool = False, queries: int | None = None) -> int:
    """One mini-batch of one head's reads, forward and backward: its coefficients, the keys' forward and deltas
    at M_0, and the queries' reads (M_0 and, with a momentum carried in, the momentum S_0 side by side; at
    `queries` read positions instead of its b tokens)."""
    return (coefficients(b, tok, decay_grad, momentum) + inner_keys(b, widths, bias, norm)
            + inner_read(b, widths, bias, norm, 1 + (momentum and not first), decay_grad or momentum, queries))


def coefficients(b: int, tok: bool, decay_grad: bool, momentum: bool) -> int:
    """tmem.memory.gradient._coefficients for one mini-batch of b tokens, forward and backward: the decays D_il
    from the cumulative log decay (sub, and two selects around the exp, which XLA makes again in each fusion that
    reads them, so that a fixed decay, or none, costs as much), C = D theta, K = tok C; with momentum its decays
    E as D, m = D P and C = (D E) theta, a b x b x b matmul."""
    S = b * b
    flops = 8 * S + 7 * S + (7 * S if tok else 0) + cumsum(b) * (1 + decay_grad)
    if momentum:  # log eta always comes from the token
        flops += 8 * S + 2 * S + 2 * cumsum(b) + matmul(b, b, b, 1 + decay_grad)
    return flops


def inner_keys(b: int, widths: list[int], bias: bool, norm: bool) -> int:
    """tmem.memory.key_gradients on one mini-batch's b keys at M_0, forward and its written-out backward: each
    layer's x W + b (its three matmuls: forward, W's gradient, x's), a hidden layer's delta = (delta_out W_out^T)
    GELU'(z) (forward, and backward to delta_out and W_out: three matmuls more, and W_out's two gradients added),
    and the output's delta: the LayerNorm's at LN(z) - (v - k), or z - v (and its negated gradient to v)."""
    flops = 0
    for i, (a, c) in enumerate(zip(widths, widths[1:])):
        flops += matmul(b, a, c) + (b * c + (b - 1) * c if bias else 0)  # the bias's add and its gradient's sum
        if i < len(widths) - 2:
            e = widths[i + 2]
            flops += 3 * 2 * b * c * e + c * e + b * c * KEYS_HIDDEN[bias]
    D = widths[-1]
    return flops + b * D * (KEYS_NORM[bias] if norm else 2)


def inner_read(b: int, widths: list[int], bias: bool, norm: bool, starts: int, trained: bool,
               queries: int | None = None) -> int:
    """One mini-batch's reads at its b queries (or at `queries` read positions), forward and backward: per
    layer, the input times the `starts` matrices side by side (M_0, and the momentum S_0), scaled per token (by
    coefficients that train if there is a decay or momentum) and summed, minus the scores K (x x_j + 1) times the
    deltas, the biases the same way, GELU between; then q + LN(.) (norm)."""
    r = b if queries is None else queries
    flops = 0
    for i, (a, c) in enumerate(zip(widths, widths[1:])):
        flops += matmul(r, a, c * starts) + matmul(r, a, b) + matmul(r, b, c)
        # sum_i c_i y_i (backward, y_i's gradients, and c_i's summed); the gradients of h added
        flops += r * c * (3 * starts + (3 * starts if trained else 0))
        flops += 6 * r * b + 2 * r * c  # the scores' + 1 and product, both gradients; the subtraction, negated
        if bias:  # + sum_i c_i bias_i, and the gradients
            flops += r * c * (4 * starts - 1)
        if i < len(widths) - 2:
            flops += elementwise(r * c, GELU)
    return flops + (elementwise(r * widths[-1], TTT_LN) + r * widths[-1] if norm else 0)


def inner_write(b: int, widths: list[int], bias: bool, momentum: bool, carried: bool) -> int:
    """The state after a mini-batch that closes, forward and backward: M_0 <- A_b M_0 (+ tok m S_0) - sum_j K_bj
    grad_j, each gradient sum X^T (w delta) per layer; with momentum S <- P_b S_0 - sum_j E_bj theta_j grad_j too.
    carried: the momentum S_0 is carried in (not the first mini-batch's zero), its two terms 10 FLOPs a weight."""
    flops = 0
    for a, c in zip(widths, widths[1:]):
        weights = a * c + c * bias
        grads = matmul(a, b, c) + 10 * b * c + (matmul(1, b, c) if bias else 0)  # X^T (w delta), w . delta
        flops += (1 + momentum) * (grads + 8 * weights) + 2 * weights  # the combinations, and -grads
        flops -= 10 * weights if momentum and not carried else 0
    return flops
