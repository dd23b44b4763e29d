"""The FLOP counts of the memories whose decay differs per channel, so the fast-weight chunks' scalar-decay
machinery does not hold: RWKV-7's chunked generalised delta rule and Mamba-1's selective scan.

The shared costs (matmuls, elementwise maps, the intra-chunk scores, the UT
solve) are tmem.memory.flops's; the rows read these through tmem.mixers.flops.
"""

from __future__ import annotations

import math

from tmem.memory.flops import DIFFERENCE, PRODUCT, elementwise, intra_scores, matmul, unit_lower_inverse


def rwkv7_chunked(BH: int, T: int, d: int, chunk: int, once: bool = False) -> int:
    """tmem.memory.rwkv7.chunked for BH heads of T tokens with keys and values d wide, from an empty state as
    training starts: the removal keys' products and decays, the cumulative log decay, the two kinds of scores
    against the removal keys scaled a token back (the removal's L and the replacement keys' P), P V, the UT
    solve, and the read's two scores and matmuls. With one chunk nothing reads the final state, so XLA drops it;
    with several the state passes through a scan (once: one step of it, as XLA counts)."""
    N = math.ceil(T / chunk)
    C, chunks, rows = chunk, BH * N, BH * N * chunk
    from_state = N > 1
    vector = lambda: intra_scores(chunks, C, d, d, True)  # noqa: E731  scores against a per-channel decay
    flops = matmul(chunks * C, C, d, grads=1)  # b = tril @ g
    flops += elementwise(rows * d, PRODUCT) + elementwise(rows * d, (1, 1))  # alpha = -(a * beta)
    flops += elementwise(rows * d, (1, 1)) + elementwise(rows * d, PRODUCT)  # beta e^{-g}
    flops += 2 * vector() + elementwise(chunks * C * C, (1, 1))  # L, and P's strict mask
    flops += matmul(rows, C, d)  # P V
    flops += elementwise(chunks * C * C, (1, 1))  # -L into the solve
    flops += chunks * unit_lower_inverse(C) + matmul(rows, C, d * (1 + from_state)) + 2 * chunks * C * C
    flops += 2 * vector() + 2 * matmul(rows, C, d) + rows * d  # the read: two scores, two matmuls, their sum
    if from_state:  # E = beta e^{b - g}; decays to the chunk's end; the writes; the state's read; the scan
        flops += elementwise(rows * d, DIFFERENCE) + elementwise(rows * d, PRODUCT)
        flops += elementwise(rows * d, DIFFERENCE) + 2 * elementwise(rows * d, PRODUCT)
        flops += matmul(chunks * d, C, d) + elementwise(rows * d, PRODUCT) + matmul(rows, d, d) + rows * d
        flops += (1 if once else N) * (matmul(BH * C, d, d) + matmul(BH * d, C, d) + 4 * BH * d * d)
    return flops


def selective_scan(B: int, T: int, d: int, N: int, reads: int | None, once: bool = False) -> int:
    """tmem.memory.selective.scan for B examples of d channels with N states each, over T tokens (once: one step,
    as XLA counts the scan): every step decays, writes and reads the d x N state, forward and backward, and
    accumulates A's gradient. XLA's CPU count of one step is 29 per state element, 3 per channel, less 1 per
    state of each example (fitted exactly over eight shapes); reads: the rows kept after the scan, whose
    gradients are scattered back."""
    flops = (1 if once else T) * (29 * B * d * N + 3 * B * d - B * N)
    return flops if reads is None else flops + reads * d
