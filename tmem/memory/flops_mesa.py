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


def sums_and_solves(BH: int, T: int, d: int, chunk: int, decay_grad: bool, strength_grad: bool, steps: int,
                    reads: int | None = None, masked: bool = False, once: bool = False) -> int:
    """mesa.parallel's sums H_t and its ridge solves (tmem.memory.ridge_solve) for BH heads of T tokens, forward
    and backward, from an empty state: reads, the systems made at that many (example, read, head) rows alone
    (fewer reads than a chunk's tokens), else every token's (masked: the rows not read have no right side).

    Forward, each chunk's C x C gated decays times its keys' outer products (at the reads, each read's row of
    its chunk's decays over every token, zero in the others: a matmul over all T), a decayed entry state added
    where several chunks pass one, and `steps` CG iterations (the products H p + Lambda p). Backward, the same
    iterations on the adjoint system, and the sums' gradients through the keys: the scores x k^T and g k^T,
    the decays' gradient, and the keys' (two matmuls back); Lambda's, and the entry states'. Several chunks pass
    their entry states through a scan (once: count one step of it, as XLA does). The final sum H_T, which a
    training step never reads, XLA drops, and so does this count.
    """
    N = math.ceil(T / chunk)
    C = chunk if N > 1 else T
    chunks, tokens, E = BH * N, BH * N * C, d * d
    systems = tokens if reads is None else reads
    pairs = chunks * C * C if reads is None else reads * N * C  # the weights W: each system's over the tokens
    flops = gates(chunks, C, decay_grad, strength_grad)
    if reads is not None and (decay_grad or strength_grad):  # each read's row picked and masked; backward too
        flops += 3 * pairs
    if N > 1:  # each chunk's gated write and the scan, forward and backward
        flops += matmul(chunks * E, C, 1) + chunks * C * (5 * E + d) + tokens * 7 + (1 if once else N) * BH * E * 5
        # e S added (2 E); backward S x (2 E), e's gradient (g . S x), S's: e g (d) times x (2 E a system, summed
        # over the chunk's systems where they share one state: negated once a chunk)
        flops += systems * (6 * E + 3 * d + 1) + (0 if reads else chunks * E)
    if masked:
        flops += systems * d
    flops += tokens * E + 2 * pairs * E  # the outer products and the weights' matmul
    solve = 2 * E + 7 * d + (1 if once else steps) * (cg_step(d) + 2 * d)  # cg_step's product, + Lambda p
    flops += 2 * systems * solve
    # the scores x k^T and g k^T and the two matmuls back (2 pairs d each), dW = -(x k^T)(g k^T) and W times each
    # score (2 pairs each), the keys' gradient's sum and sign; Lambda's gradient -g x summed over the systems
    flops += 8 * pairs * d + 4 * pairs + 2 * tokens * d + 3 * systems * d
    return flops


def gates(chunks: int, C: int, decay_grad: bool, strength_grad: bool) -> int:
    """mesa's gated decays in chunks of C: b = cumsum(log a); exp(where(b_t - b_j)) * beta_j: sub, select, product;
    backward, beta's gradient (product, sum), and through exp, where and the difference to log a (product,
    product, select, sum and -sum). With neither training they are a constant mask, which XLA folds away."""
    if not (decay_grad or strength_grad):
        return 0
    return chunks * (cumsum(C) * (1 + decay_grad) + C * C * (3 + (8 if decay_grad else 2)))


def cg_step(d: int) -> int:
    """One conjugate-gradient iteration on one system of d unknowns: A p, p . Ap, alpha (a division made safe:
    compare, two selects, divide), x and r, r . r, beta (the same), p.

    Every iteration counts whole, as the loop runs it: unrolled, XLA would drop the last one's updates of r and
    p that nothing reads (100 of these 680 FLOPs at d = 16).
    """
    return 2 * d * d + 10 * d + 8
