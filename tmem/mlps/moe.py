"""Mixture of experts (`mlp=moe`): E small MLPs, each token read by the top_k its router picks (Chapter 9).

The router is a linear map to E logits and a softmax, p = softmax(x W_r);
a token goes to the top_k experts of p, and their outputs are added with
gates g: p of the chosen, renormalised over them (`renormalize`, Mixtral's),
or p as it is (Switch's, the one choice with top_k = 1, where renormalised
gates are all 1 and the router would learn from the balance loss alone).

The load-balancing loss (Switch, GShard) is E * sum_e f_e P_e over the
tokens of a call: f_e the fraction of the (token, choice) assignments that
went to expert e, P_e the mean router probability of e; 1 when both are
uniform, E when one expert takes everything. Only P carries a gradient. The
layer sows it as an AuxiliaryLoss with `balance_weight`: the train step adds
balance_weight times each layer's loss to the task's (summed over the layers,
as Switch does; tmem.train.step) and reports `balance_loss`, their mean.

The training form (`grouped`) computes each expert on its own tokens only:
the assignments sorted by expert into a buffer where each expert's rows are
padded to a multiple of `block`, and one batched matmul over the blocks, each
with its expert's weights. Nothing is dropped, so it equals `dense_oracle`
(every expert on every token, the unchosen gated to zero) in values and
gradients; it computes A + E * block rows at most (A = tokens x top_k), a
static bound the FLOP count uses. (jax.lax.ragged_dot is the grouped matmul
an accelerator runs; on a CPU XLA lowers it to every expert on every token.)
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from tmem.layers import linear
from tmem.mlps.base import AuxiliaryLoss, MLPConfig
from tmem.mlps.dense import GATED, SCORES, dense_parameters, hidden_units, score


@dataclasses.dataclass(frozen=True)
class MoEConfig(MLPConfig):
    name: str = "moe"
    experts: int = 8
    top_k: int = 2
    expansion: float = 2.0  # each expert's hidden units per model width: top_k x 2 = the dense default's 4 active
    score: str = "relu"  # each expert's score function (a dense MLP's: linear, relu, relu2, relu3, gelu, swiglu)
    bias: bool = False
    renormalize: bool = True  # gates: p of the chosen over their sum (Mixtral); false: p itself (Switch)
    balance_weight: float = 0.01  # the load-balancing loss's coefficient in the training loss (Switch's 0.01)
    block: int = 16  # rows each expert's assignments are padded to a multiple of, in the training form

    def __post_init__(self):
        checks = [
            (self.experts >= 1, f"mlp.experts={self.experts} must be positive"),
            (1 <= self.top_k <= self.experts, f"mlp.top_k={self.top_k} must be in 1..mlp.experts={self.experts}"),
            (self.expansion > 0, f"mlp.expansion={self.expansion} must be positive"),
            (self.score in SCORES, f"mlp.score={self.score!r} is not one of: {', '.join(SCORES)}"),
            (self.balance_weight >= 0, f"mlp.balance_weight={self.balance_weight} must be zero or more"),
            (self.block >= 1, f"mlp.block={self.block} must be positive"),
            (not (self.renormalize and self.top_k == 1),
             "mlp.renormalize=true with mlp.top_k=1 gates every token by 1, so the router would learn from the "
             "balance loss alone: set mlp.renormalize=false (Switch's gate, the router's probability)"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    def expert_parameters(self, width: int) -> int:
        return dense_parameters(width, hidden_units(self.expansion, width), self.score, self.bias)

    def parameters(self, width: int) -> tuple[int, int]:
        router, expert = width * self.experts, self.expert_parameters(width)
        return router + self.top_k * expert, router + self.experts * expert


def route(probs: jax.Array, top_k: int, renormalize: bool) -> tuple[jax.Array, jax.Array]:
    """(experts [N, k], gates [N, k]) of router probabilities [N, E]."""
    gate, index = jax.lax.top_k(probs, top_k)
    if renormalize:
        gate = gate / jnp.sum(gate, axis=-1, keepdims=True)
    return index, gate


def balance_loss(probs: jax.Array, index: jax.Array) -> jax.Array:
    """E * sum_e f_e P_e: f_e the share of the assignments `index` [N, k] that chose e (no gradient), P_e the mean
    of probs [N, E] over the tokens."""
    E = probs.shape[-1]
    f = jnp.bincount(index.reshape(-1), length=E) / index.size
    return E * jnp.sum(f * jnp.mean(probs, axis=0))


def _expert(x, w_in, b_in, w_out, b_out, name):
    """One expert's y = W_out s(W_in x + b_in) + b_out; batched over leading axes of the weights."""
    h = jnp.matmul(x, w_in) + (0 if b_in is None else b_in[..., None, :])
    y = jnp.matmul(score(h, name), w_out)
    return y + (0 if b_out is None else b_out[..., None, :])


def dense_oracle(x, index, gate, experts: dict, name: str) -> jax.Array:
    """The definition: every expert on every token x [N, D], summed with gates zero for the unchosen."""
    E = experts["w_in"].shape[0]
    gates = jnp.zeros((x.shape[0], E), gate.dtype).at[jnp.arange(x.shape[0])[:, None], index].add(gate)
    y = _expert(x[None], experts["w_in"], experts.get("b_in"), experts["w_out"], experts.get("b_out"), name)
    return jnp.einsum("ne,end->nd", gates, y)


def blocks_of(tokens: int, top_k: int, experts: int, block: int) -> int:
    """Blocks of the training form's buffer: enough for any routing (sum_e ceil(c_e / block) <= A // block + E)."""
    return tokens * top_k // block + experts


def grouped_rows(index: jax.Array, experts: int, block: int):
    """Where each assignment goes in the buffer: (row [N, k], the expert of each block, the token of each row).

    The assignments are sorted by expert (stably), each expert's run starting at a multiple of `block`; rows
    left over read token 0 and are never gathered back.
    """
    N, k = index.shape
    A, E = N * k, experts
    flat = index.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    counts = jnp.bincount(flat, length=E)
    padded = -(-counts // block) * block
    start, padded_start = jnp.cumsum(counts) - counts, jnp.cumsum(padded) - padded
    chosen = flat[order]
    rows_sorted = padded_start[chosen] + jnp.arange(A) - start[chosen]
    row = jnp.zeros(A, jnp.int32).at[order].set(rows_sorted.astype(jnp.int32))
    n_blocks = blocks_of(N, k, E, block)
    block_expert = jnp.searchsorted(jnp.cumsum(padded), jnp.arange(n_blocks) * block, side="right")
    token = jnp.zeros(n_blocks * block, jnp.int32).at[row].set(jnp.arange(A, dtype=jnp.int32) // k)
    return row.reshape(N, k), jnp.minimum(block_expert, E - 1), token


def grouped(x, index, gate, experts: dict, name: str, block: int) -> jax.Array:
    """The training form: each expert on its own assignments, in blocks (see the module's docstring)."""
    (_, D), E = x.shape, experts["w_in"].shape[0]
    row, block_expert, token = grouped_rows(index, E, block)
    xs = x[token].reshape(block_expert.shape[0], block, D)
    pick = lambda name: None if experts.get(name) is None else experts[name][block_expert]  # noqa: E731
    y = _expert(xs, pick("w_in"), pick("b_in"), pick("w_out"), pick("b_out"), name).reshape(-1, D)
    return jnp.einsum("nk,nkd->nd", gate, y[row])


class MoE(nnx.Module):
    """A router and E experts of [width -> hidden -> width] each; y of [..., width] position by position."""

    auxiliary_losses = True  # sows the balance loss (tmem.mlps.base.with_auxiliary_losses)

    def __init__(self, cfg: MoEConfig, width: int, *, rngs: nnx.Rngs):
        self.cfg = cfg
        E, hidden = cfg.experts, hidden_units(cfg.expansion, width)
        n_in = 2 * hidden if cfg.score in GATED else hidden
        self.router = linear(width, E, bias=False, rngs=rngs)
        init = nnx.initializers.lecun_normal(batch_axis=(0,))  # each expert as an nnx.Linear of its own
        self.w_in = nnx.Param(init(rngs.params(), (E, width, n_in)))
        self.w_out = nnx.Param(init(rngs.params(), (E, hidden, width)))
        self.b_in = nnx.Param(jnp.zeros((E, n_in))) if cfg.bias else None
        self.b_out = nnx.Param(jnp.zeros((E, width))) if cfg.bias else None

    def experts(self) -> dict:
        return {name: None if p is None else p[...] for name, p in
                (("w_in", self.w_in), ("b_in", self.b_in), ("w_out", self.w_out), ("b_out", self.b_out))}

    def route(self, x: jax.Array):
        """(experts [N, k], gates [N, k], probabilities [N, E]) of tokens x [N, width]; the softmax in float32."""
        probs = jax.nn.softmax(self.router(x).astype(jnp.float32), axis=-1)
        index, gate = route(probs, self.cfg.top_k, self.cfg.renormalize)
        return index, gate, probs

    def __call__(self, x: jax.Array) -> jax.Array:
        cfg, shape = self.cfg, x.shape
        x = x.reshape(-1, shape[-1])
        index, gate, probs = self.route(x)
        self.sow(AuxiliaryLoss, "balance_loss", (cfg.balance_weight, balance_loss(probs, index)), capture_noop=True)
        y = grouped(x, index, gate.astype(x.dtype), self.experts(), cfg.score, cfg.block)
        return y.reshape(shape)
