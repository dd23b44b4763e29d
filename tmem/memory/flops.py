"""FLOPs of the fast-weight memory, forward and backward, as XLA's CPU cost analysis counts them: the chunked
form (tmem.memory.chunked) and the recurrent one (tmem.memory.linear_state.recurrent), the memory's part of
tmem.flops' count of a training step.

A matmul [m, k] x [k, n] is 2mkn, and 2mkn more for each operand's gradient;
an elementwise op is 1 FLOP an element (exp and other transcendentals, which
XLA reports apart, count 0); composite ops carry their measured
(forward, backward) costs per element.
"""

from __future__ import annotations

import math

# products and differences: both operands' gradients; one broadcast (beta v, b_i - b_j) sums its gradient too
PRODUCT, SCALED, DIFFERENCE, BROADCAST_PRODUCT = (1, 2), (1, 3), (1, 3), (1, 4)
ON_BLOCK = 11  # a vector decay's diagonal blocks: b_i - b_j, where, exp, the three-way product and sum over k


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
            delta: bool, chunk: int, sub_chunk: int, reads: int | None, once: bool = False) -> int:
    """tmem.memory.chunked.chunked for BH heads of T tokens, from an empty state as training starts.

    decay: None, or the width G of the log decay (1 for a scalar, dk for a vector); decay_grad: whether it
    trains (RetNet's is fixed). reads: None (every position) or the number of (example, read, head) rows
    `_read_at` reads. The state passes through a scan over chunks only when there are several (once: count
    one step of it, as XLA does); with one chunk nothing reads it, and the quadratic form is all.
    """
    N = math.ceil(T / chunk)
    C, chunks, rows = chunk, BH * N, BH * N * chunk
    from_state = N > 1
    by_decay = (SCALED if decay == 1 else PRODUCT) if decay else (0, 0)  # x * exp(b), b broadcast if scalar
    flops = 0
    if decay:  # b = tril(1) @ g, a gradient for g only; from chunk to chunk, k * exp(b_C - b)
        flops += matmul(rows, C, decay, grads=int(decay_grad))
        if from_state:
            flops += elementwise(rows * decay, (1, 1), decay_grad) + elementwise(rows * dk, by_decay)
    if strengths:
        flops += elementwise(rows * dv, SCALED)  # u = beta v
    if delta:  # L = beta (k k^T strictly below the diagonal); U = (I + L)^{-1} rhs, rhs = [u, beta k e^b]
        flops += intra_scores(chunks, C, dk, decay, decay_grad, sub_chunk) + elementwise(chunks * C * C, SCALED)
        if from_state:
            flops += elementwise(rows * dk, SCALED) + elementwise(rows * dk, by_decay)
        # the inverse has no backward: unit_lower_solve's is two matmuls with the inverse it kept, and a mask
        flops += chunks * unit_lower_inverse(C) + matmul(rows, C, dv + dk * from_state) + 2 * chunks * C * C
    elif from_state:  # every chunk's write k^T u at once, outside the scan
        flops += matmul(BH * N * dk, C, dv)
    if from_state:
        flops += (1 if once else N) * state_pass(BH, C, dk, dv, decay, delta)
    if reads is None:
        flops += intra_scores(chunks, C, dk, decay, decay_grad, sub_chunk) + matmul(rows, C, dv)
        if from_state:  # + (q e^b) S_in
            flops += elementwise(rows * dk, by_decay) + matmul(rows, dk, dv) + rows * dv
        return flops
    return flops + read_at(reads, C, dk, dv, decay, from_state)


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


def read_at(R: int, C: int, dk: int, dv: int, decay: int | None, from_state: bool) -> int:
    """tmem.memory.chunked._read_at for R (example, read, head) rows: one row of scores against the read's
    chunk. Backward, the gathered keys, values, decays (and state) have their gradients scattered back."""
    flops = matvec(R, C, dk) + matvec(R, C, dv) + R * C * (dk + dv) + R * dk  # scores, read, scatters
    if decay:  # exp(where(visible, b_p - b_j)): sub, select and their gradients, b_p's and b_j's scattered
        flops += 6 * R * C * decay
        flops += elementwise(R * C * (dk if decay > 1 else 1), PRODUCT)  # k_j * decay, or scores * decay
    else:
        flops += elementwise(R * C, (1, 1))  # where(visible, scores, 0)
    if from_state:
        flops += matvec(R, dk, dv) + R * dv + R * dk * dv + (elementwise(R * dk, PRODUCT) if decay else 0)
    return flops


def intra_scores(chunks: int, C: int, dk: int, decay: int | None, decay_grad: bool, sub_chunk: int) -> int:
    """tmem.memory.chunked.intra_scores for `chunks` chunks of C tokens: masked q k^T, times the decays."""
    where = elementwise(chunks * C * C, (1, 1))
    if decay is None:
        return matmul(chunks * C, dk, C) + where
    if decay == 1:  # exp(where(mask, b_i - b_j)) * (q k^T); no gradient into a fixed decay
        diff = elementwise(chunks * C * C, DIFFERENCE, decay_grad) + (where if decay_grad else chunks * C * C)
        return matmul(chunks * C, dk, C) + diff + elementwise(chunks * C * C, PRODUCT if decay_grad else (1, 1))
    # a vector decay in sub-chunks of c tokens: every c x c x dk decay on the diagonal blocks; off them the
    # decays factor through each block's first and last rows
    c = max(s for s in range(1, min(sub_chunk, C) + 1) if C % s == 0)
    n = C // c
    on_block = chunks * n * c * c * dk * ON_BLOCK
    x_ref_k_end = 2 * chunks * C * dk * (sum(DIFFERENCE) + sum(PRODUCT))  # x * exp(b - b_first), k * ...
    between = elementwise(chunks * n * n * dk, DIFFERENCE) + elementwise(chunks * n * n * dk, (1, 1))
    k_ref = elementwise(chunks * n * C * dk, BROADCAST_PRODUCT)
    off_block = matmul(chunks * C, dk, C)  # "Iik,IJjk->IiJj": every pair of blocks, the diagonal ones too
    diagonal = 4 * chunks * C * C  # placed by an einsum with the identity (a matmul of depth 1) and added
    return on_block + x_ref_k_end + between + k_ref + off_block + diagonal


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
