"""FLOPs of each MLP in a training step, forward and backward, counted as tmem.flops counts the step.

One function per config type (MLP_FLOPS), each taking the config, the width
and the rows the MLP reads (tokens; at the last layer only the scored ones).
Gathers cost nothing forward and one FLOP per element added in their
backward (a scatter-add); top_k costs nothing but the scatter of its k
values' gradients; index arithmetic (the mixture's sorting and counting) is
left out, as tmem.flops leaves it out elsewhere.
"""

from __future__ import annotations

from tmem.memory.flops import GELU, elementwise, matmul
from tmem.mixers.flops import SILU, SOFTMAX, Uncounted
from tmem.mlps.dense import GATED, DenseConfig, hidden_units
from tmem.mlps.moe import MoEConfig, blocks_of
from tmem.mlps.pkm import PKMConfig

# score functions (forward, backward) per hidden unit, as XLA's CPU cost analysis counts each alone
SCORE_FUNCTIONS = {"linear": (0, 0), "relu": (1, 2), "relu2": (2, 5), "relu3": (3, 6), "gelu": GELU, "swiglu": SILU}


def _hidden_layer(rows: int, D: int, hidden: int, score: str, bias: bool) -> int:
    """W_out s(W_in x + b_in) + b_out over `rows` rows (SwiGLU: W_out (silu(a) * b)), forward and backward."""
    gated = score in GATED
    n_in = hidden * (1 + gated)
    flops = matmul(rows, D, n_in) + matmul(rows, hidden, D)
    flops += elementwise(rows * hidden, SCORE_FUNCTIONS[score]) + (3 * rows * hidden if gated else 0)
    if bias:
        flops += 2 * rows * (n_in + D)  # the adds, and the sums of their gradients
    return flops


def dense(cfg: DenseConfig, D: int, rows: int) -> int:
    return _hidden_layer(rows, D, hidden_units(cfg.expansion, D), cfg.name, cfg.bias)


def moe(cfg: MoEConfig, D: int, rows: int) -> int:
    """The router, its softmax, gates and balance loss; the experts on the buffer's rows (the active experts:
    rows x top_k assignments, padded per expert to a multiple of `block`, at most E blocks more); the gathers
    in and out of the buffer, and the gated sum."""
    E, k = cfg.experts, cfg.top_k
    hidden = hidden_units(cfg.expansion, D)
    n_in = hidden * (1 + (cfg.score in GATED))
    blocks = blocks_of(rows, k, E, cfg.block)
    buffer = blocks * cfg.block
    flops = matmul(rows, D, E) + elementwise(rows * E, SOFTMAX)
    flops += rows * k  # top_k's backward scatter
    if cfg.renormalize:
        flops += elementwise(rows * k, (2, 4))  # g / sum(g): the sum and the divide, and their gradients
    flops += 3 * rows * E + 3 * E  # the balance loss: P's mean, f P, the sum; P's gradient broadcast back
    flops += _hidden_layer(buffer, D, hidden, cfg.score, cfg.bias)
    flops += buffer * D + blocks * (D * n_in + hidden * D)  # scatters of the gathered rows' and weights' gradients
    if cfg.bias:
        flops += blocks * (n_in + D)
    flops += 2 * rows * k * D + 3 * rows * k * D + rows * k * D  # the gated sum, its gradients, y[row]'s scatter
    return flops


def pkm(cfg: PKMConfig, D: int, rows: int) -> int:
    """The query map, each half's scores against its sub-keys, the top_k^2 candidate sums and their top_k, the
    softmax over the chosen and the read of their values."""
    H, n, K, d = cfg.heads, cfg.keys, cfg.top_k, cfg.query_width(D)
    RH = rows * H
    flops = matmul(rows, D, H * d) + 2 * matmul(RH, d // 2, n)
    flops += 2 * RH * K  # the halves' top_k backward scatters
    flops += RH * K * K * (1 + 2) + RH * K * K * 2  # the sums and their gradients to both halves; the pair indices
    flops += RH * K  # the final top_k's backward scatter
    flops += elementwise(RH * K, SOFTMAX)
    flops += 6 * RH * K * D  # the weighted sum (2), its gradients (3), and the values' scatter-add (1)
    return flops


MLP_FLOPS = {DenseConfig: dense, MoEConfig: moe, PKMConfig: pkm}


def mlp_flops(cfg, D: int, rows: int) -> int:
    """An MLP's FLOPs; a config type without a count is refused, never counted as zero."""
    if type(cfg) not in MLP_FLOPS:
        raise Uncounted(f"mlp {cfg.name!r} has no FLOP count: add one to tmem.mlps.flops.MLP_FLOPS")
    return MLP_FLOPS[type(cfg)](cfg, D, rows)
