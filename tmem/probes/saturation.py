"""Softmax attention early in training at a fixed beta: how peaked its rows start, and what gradient reaches W_K.

The note's Chapter 13: "attention saturates to one token and trains badly",
read in Chapter 6 as too large a beta: the softmax becomes an argmax, whose
gradient vanishes. With unit queries and keys (mixer.qk_norm=l2) the logits
are beta times a cosine, so training cannot shrink them by shrinking W_Q and
W_K. The probe reads the model at step 0 (rebuilt from the run's seed, as
training built it) and at every saved checkpoint up to
`options.saturation.until` (default 200 steps), on the first 64 held-out
sequences: the training loss, the norm of its gradient with respect to every
layer's W_K and with respect to all parameters (what training logs as
`grad_norm`, here on held-out sequences), the median and mean over the
sequences of the norm of each one's own gradient at W_K (how evenly the
sequences carry it), and the mean entropy of the attention rows at the query
positions, over every layer and head, beside the entropy of a uniform row.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from flax import nnx

from tasks import heldout
from tmem.probes.base import Probe, ProbeInput
from tmem.probes.diffusion import applies, row_entropy
from tmem.probes.heads import forward_with_attention
from tmem.train.build import build
from tmem.train.step import make_loss

EXAMPLES = 64  # held-out sequences each checkpoint is read on
UNTIL = 200  # the last step read by default: the start of training


@functools.partial(jax.jit, static_argnums=(0, 1))
def batch_gradients(graphdef, task, params, rest, batch):
    (loss, _), grads = jax.value_and_grad(make_loss(graphdef, task), has_aux=True)(params, rest, batch)
    return loss, grads


@functools.partial(jax.jit, static_argnums=(0, 1))
def sequence_gradients(graphdef, task, params, rest, batch):
    """Each sequence's own gradient [B, ...]: their mean is the batch's, as every MQAR sequence scores as many
    positions."""
    loss = make_loss(graphdef, task)

    def one(example):
        return jax.grad(lambda p: loss(p, rest, jax.tree.map(lambda x: x[None], example))[0])(params)

    return jax.vmap(one)(batch)


def key_parts(model, grads) -> list:
    """Each layer's W_K part of a gradient (any leading axes kept): the key columns of the fused q, k, v kernel,
    cut as the layer cuts it."""
    return [block.mixer.qkv_maps(grads["blocks"][i]["mixer"]["qkv"]["kernel"][...])[1]
            for i, block in enumerate(model.blocks)]


def key_gradients(model, task, batch) -> dict:
    """The training loss on `batch`, the norm of its gradient with respect to each layer's W_K ([depth]) and with
    respect to all parameters, and the median and mean over the batch's sequences of the norm of each sequence's
    own gradient at W_K (all layers): a gradient that a few sequences carry has a median far below its mean."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    loss, grads = batch_gradients(graphdef, task, params, rest, batch)
    per_sequence = key_parts(model, sequence_gradients(graphdef, task, params, rest, batch))  # [B, D, E] each
    sequence_norms = np.sqrt(sum(np.sum(np.square(k), axis=(-2, -1)) for k in per_sequence))  # [B]
    return {"loss": float(loss), "key_grad_norms": [float(np.linalg.norm(k)) for k in key_parts(model, grads)],
            "grad_norm": float(np.sqrt(sum(np.sum(np.square(g)) for g in jax.tree.leaves(grads)))),
            "sequence_key_grad_median": float(np.median(sequence_norms)),
            "sequence_key_grad_mean": float(np.mean(sequence_norms))}


def query_entropy(A, positions) -> float:
    """The mean entropy of the attention rows at the query positions, over every layer, head and query.

    A: [depth, B, H, T, S]; positions: [B, Q]."""
    A, positions = np.asarray(A), np.asarray(positions)
    rows = A[:, np.arange(A.shape[1])[:, None], :, positions]  # [B, Q, depth, H, S]
    return float(row_entropy(rows).mean())


def read_early(models, task, examples: int = EXAMPLES) -> dict[str, list]:
    """Each (step, model)'s loss, gradients and query-row entropy on the first `examples` held-out sequences."""
    batch = jax.tree.map(lambda x: x[:examples], heldout(task))
    measured = ("loss", "key_grad_norms", "grad_norm", "sequence_key_grad_median", "sequence_key_grad_mean")
    rows: dict[str, list] = {"step": [], "key_grad_norm": [], "entropy": [], **{name: [] for name in measured}}
    for step, model in models:
        g = key_gradients(model, task, batch)
        rows["step"].append(int(step))
        rows["key_grad_norm"].append(float(np.linalg.norm(g["key_grad_norms"])))
        for name in measured:
            rows[name].append(g[name])
        rows["entropy"].append(query_entropy(forward_with_attention(model, batch.inputs)[1], batch.positions))
    rows["uniform_entropy"] = float(np.log(np.asarray(batch.positions) + 1.0).mean())
    return rows


def saturation_figure(rows, beta):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.2))
    axes = fig.subplots(1, 3)
    for ax, name, label in zip(axes, ("loss", "key_grad_norm", "entropy"),
                               ("training loss", "|dL/dW_K| (all layers)", "entropy at queries (nats)")):
        ax.plot(rows["step"], rows[name], "o-")
        ax.set(xlabel="step", ylabel=label)
    axes[1].set_yscale("log")
    axes[2].axhline(rows["uniform_entropy"], color="k", ls=":", label="uniform row")
    axes[2].legend(fontsize=7)
    fig.suptitle(f"softmax at beta = {beta}: the start of training")
    fig.tight_layout()
    return fig


def run(inp: ProbeInput):
    """options.saturation.until: the last step read (default 200); options.saturation.examples (default 64)."""
    until = int(inp.options.get("until", UNTIL))
    steps = [s for s in inp.history.steps if s <= until] if inp.history is not None else []

    def models():
        yield 0, build(inp.cfg).model  # step 0 is never saved: the seed draws it again
        if steps:
            yield from inp.history.models(steps)

    rows = read_early(models(), inp.cfg.task, int(inp.options.get("examples", EXAMPLES)))
    beta = inp.cfg.layers[-1].beta(inp.model.blocks[-1].mixer.d_head)
    rows["beta"] = float(beta)
    return rows, {"saturation": saturation_figure(rows, beta)}


probe = Probe(
    run=run,
    applies=applies,
    description="softmax early in training: the loss, the gradient reaching W_K and the attention entropy",
)
