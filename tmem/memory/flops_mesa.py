"""The FLOP counts of mesa's memory (tmem.memory.mesa), forward and backward: the sums H_t and the conjugate-
gradient solve of its parallel form, and its chunked conjugate-gradient form.

The chunked form's products (H_t + Lambda) p are made from each chunk's entry state and gated
keys, never from H_t: per chunk and CG step, the scores p k^T, their decays and
the product with the keys (two C x C x d matmuls), and e^{b_t} S_in p where a
state enters. The solve's backward is the same CG on the adjoint system plus
one pullback of that product to the chunk's state, decays and keys. The
shared costs (matmuls, cumsum) are tmem.memory.flops's; the rows read these
through tmem.mixers.flops.
"""

from __future__ import annotations

import math

from tmem.memory.flops import cumsum, matmul


def chunked_cg(BH: int, T: int, d: int, chunk: int, decay_grad: bool, strength_grad: bool, steps: int,
               masked: bool, once: bool = False) -> int:
    """mesa.chunked_cg's sums and solve for BH heads of T tokens (keys d wide), from an empty state: the chunks'
    gates, the states entering them (a scan when there are several; once: one step of it, as XLA counts), the
    Jacobi guess and `steps` CG iterations forward and again backward, and the pullback of the product. Every
    token's system is solved (masked: the layer reads at some positions, whose q alone is kept, the others
    zero). The read of G with the solutions is tmem.memory.flops.chunked's, counted by the row."""
    N = math.ceil(T / chunk)
    C = chunk if N > 1 else T
    chunks, rows, E = BH * N, BH * N * C, d * d
    state = N > 1
    flops = gates(chunks, C, decay_grad, strength_grad)
    if state:  # each chunk's gated write sum_j k_j k_j^T and the scan; backward, both again and a's gradient
        flops += matmul(chunks * E, C, 1) + chunks * C * (5 * E + d) + rows * 7
        flops += (1 if once else N) * BH * E * 5
        flops += rows * 2  # e^b at every token, and its gradient
    if masked:
        flops += 2 * rows * d
    # the product: scores p k^T, times the decays, times k; + lam p; with a state, e^b (S_in p) added
    product = chunks * (4 * C * C * d + C * C) + rows * 2 * d + state * rows * (2 * E + 2 * d)
    diagonal = chunks * 2 * C * C * d + rows * 2 * d + state * rows * 2 * d
    # one solve: the guess b / diag, r = b - A x and r . r, then the iterations (cg_step's matvec is `product`);
    # the backward's diagonal is the forward's, which XLA makes once
    solve = product + rows * 4 * d + (1 if once else steps) * (product + rows * (cg_step(d) - 2 * E))
    # the pullback of A x to the state, decays, keys and Lambda: the scores and their decays again, the decays'
    # and scores' gradients, the keys' two, their sum, and lam's; with a state, S_in's outer products and e's
    pullback = chunks * (8 * C * C * d + 3 * C * C + C * d) + rows * 2 * d + state * rows * (4 * E + 3 * d)
    return flops + diagonal + 2 * solve + pullback


def key_sums(BH: int, T: int, d: int, decay_grad: bool, chunk: int, once: bool = False,
             strength_grad: bool = True, reads: int | None = None) -> int:
    """tmem.memory.mesa.prefix_sums(k, k, ...) for BH heads of T tokens: H_t = sum_{j<=t} gamma_tj k_j k_j^T
    [d x d] at every t, forward and backward, from an empty state; reads: made only at that many (example, read,
    head) rows (prefix_sums_at).

    In each chunk of C tokens, every k_j k_j^T, then a C x C matmul with the gated decays exp(b_t - b_j) beta_j
    (decay_grad: whether log a trains; strength_grad: whether beta does); at the reads, each read's row of its
    chunk's decays (zero in the other chunks: a matmul over all T) picked and masked, forward and backward.
    Several chunks pass their entry states through a scan (once: count one step of it, as XLA does), and each
    H_t adds its decayed entry state.
    """
    N = math.ceil(T / chunk)
    C = chunk if N > 1 else T
    chunks, rows, E = BH * N, BH * N * C, d * d
    made = rows if reads is None else reads  # the H_t made
    gates_grad = decay_grad or strength_grad
    # k k^T (and, where the gates train, their gradient: a second matmul), and backward the sum of its gradient
    # times k, twice (k is both factors), added
    if reads is None:
        flops = matmul(chunks * C, C, E, grads=1 + gates_grad)
    else:
        flops = matmul(reads, N * C, E, grads=1 + gates_grad) + 3 * reads * N * C * gates_grad
    flops += rows * (E + 4 * E + d) + gates(chunks, C, decay_grad, strength_grad)
    if N > 1:
        # each chunk's write sum_j exp(b_C - b_j) beta_j k_j k_j^T (its gates: sub, product), and e^{b_t} H_in added
        # to each H_t, forward and backward; the scan: a H + write, and backward a times dH and a's gradient
        flops += matmul(chunks * E, C, 1) + chunks * C * (E + 4 * E + d) + rows * (2 + 5) + made * E * (2 + 4)
        flops += (1 if once else N) * BH * E * 5
    return flops


def gates(chunks: int, C: int, decay_grad: bool, strength_grad: bool) -> int:
    """mesa's gated decays in chunks of C: b = cumsum(log a); exp(where(b_t - b_j)) * beta_j: sub, select, product;
    backward, beta's gradient (product, sum), and through exp, where and the difference to log a (product,
    product, select, sum and -sum). With neither training they are a constant mask, which XLA folds away."""
    if not (decay_grad or strength_grad):
        return 0
    return chunks * (cumsum(C) * (1 + decay_grad) + C * C * (3 + (8 if decay_grad else 2)))


def cg(rows: int, d: int, steps: int, once: bool = False) -> int:
    """tmem.memory.mesa.cg_solve on `rows` systems A x = b of d unknowns: `steps` conjugate-gradient iterations
    from the Jacobi guess b / diag(A); backward, the same iterations on the adjoint system, and dA = (-db) x^T.
    The iterations are a scan (once: count one of each scan, as XLA does)."""
    init = 2 * d * d + 4 * d  # b / diag(A), r = b - A x, r . r
    return rows * (2 * (init + (1 if once else steps) * cg_step(d)) + d * d + d)


def cg_step(d: int) -> int:
    """One conjugate-gradient iteration on one system of d unknowns: A p, p . Ap, alpha (a division made safe:
    compare, two selects, divide), x and r, r . r, beta (the same), p.

    Every iteration counts whole, as the loop runs it: unrolled, XLA would drop the last one's updates of r and
    p that nothing reads (100 of these 680 FLOPs at d = 16).
    """
    return 2 * d * d + 10 * d + 8
