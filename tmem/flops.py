"""FLOPs of one training step, counted from the config: XLA's own way of counting, with every loop unrolled.

XLA's `compiled.cost_analysis()["flops"]` counts the body of a while loop
once, so it undercounts any step with a loop in it: the microbatches of
`tmem.train.step.make_gradients` (a `lax.map`: the default 64 examples in 2
slices of 32 report half the work), the scan over chunks of
`tmem.memory.chunked` and the scan over tokens of the recurrent form
(`tmem.memory.linear_state.recurrent`, mixer.run.form=recurrent), mesa's
conjugate-gradient steps (`tmem.memory.ridge_solve.cg`, forward and backward)
and the scans over mini-batches of TTT (`tmem.memory.ttt.dual`) and Titans
(`tmem.memory.gradient.parallel`).
`step_flops(cfg)` counts what the step computes, part by part, by reading the
same shapes the code makes.

How things are counted, as XLA's cost analysis on a CPU counts them:

* A matmul [m, k] x [k, n] is 2mkn; its backward is 2mkn for the gradient
  of each operand that needs one (no gradient for a constant, such as the
  triangle of ones of the chunked decays, or for the first layer's input when
  nothing before it trains).
* An elementwise op is 1 FLOP per element (compare, select, convert and
  negate included); a reduction one per element reduced; a scatter-add (the
  backward of a gather) one per element added. exp, log, rsqrt, sqrt and tanh
  are "transcendentals", which XLA reports apart and leaves out of "flops", so
  they count 0 here too. Composite functions (silu, softplus, the norms,
  softmax, the loss) have the forward and backward costs XLA reports for them
  on their own, measured on small programs (the constants below).
* Work XLA removes is not counted: values nothing reads (the final memory
  state and the intermediates a train step never returns), the last layer's
  queries, scores and MLP away from the scored positions.

Left out, each well under 1% of the default job: sampling the batch on
device (threefry's integer ops), index arithmetic, the learning-rate schedule
and other scalar work, per-row terms of norms and softmax (the statistics and
their rsqrt, a few FLOPs per row of the width). Not modelled: XLA fusing one
cheap producer into several consumers, which it then counts (and runs) once
per consumer: the short convolution's SiLU and input gradient, a norm's
statistics, the masks of the chunked memory. On the default job's rows that
puts XLA's count 0.5 to 4% above this one (tests/test_flops.py). The
memories trained in the forward pass (TTT's, Titans') carry the copies XLA
makes inside them in their measured constants (tmem.memory.flops); around
them, Titans' convolution over q, k and v, fused into the many fusions of
the memory that read them, XLA counts about twice (1% of its step). The
recurrent form's step has the most of it: XLA's CPU fusion of the add rule's
backward recomputes dS + q do^T in every fusion that reads it, a third to a
half more than the memory's count, and the delta rule's with a decay a
fifth more (tests/test_flops.py lists the copies). XLA counts that step
once; over all T tokens the copies would add 3.5 to 9% to the default job's
step for the add-rule rows (Mamba-2 the most), 2.6% for Gated DeltaNet's and
none for DeltaNet's.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import jax
from flax import nnx

from tasks.memorize import Memorize
from tmem.memory.flops import matmul
from tmem.mixers.flops import norm
from tmem.mlps import layer_of as mlp_layer
from tmem.mlps.flops import mlp_flops
from tmem.model import build_model

# the token loss per logit: cross-entropy forward and backward (4) and the accuracy's argmax (9)
TOKEN_LOSS = 13
# AdamW per parameter: the moments, bias corrections, the update and its application (13), and the global norm
# of the gradients that the step logs (2; clipping shares it); clipping's scaling (3); weight decay (2)
ADAM, GRAD_NORM, CLIP, WEIGHT_DECAY = 13, 2, 3, 2


def step_flops(cfg, loop_bodies_once: bool = False) -> dict[str, float]:
    """FLOPs of one training step of `cfg` (a validated tmem.schema.Config), by part, and their "total".

    Forward and backward of `train.batch_size` examples (however many
    microbatches), the loss, and the optimizer's update. loop_bodies_once:
    count each loop's body once instead, as XLA's cost analysis does (one
    microbatch, one chunk's state pass, one token's step of the recurrent
    form): only to check this count against XLA's.
    """
    task, m, t = cfg.task, cfg.model, cfg.train
    B = t.batch_size // microbatches(t) if loop_bodies_once else t.batch_size
    T, D = task.seq_len, m.width
    Q = scored_positions(task)  # None: every position
    reads = Q or T
    parts = Counter()
    # does the first block's input need a gradient? only if something before it trains
    if task.input_kind == "vectors":
        trained_input = m.read_in == "learned" or m.positions == "learned"
        parts["embed/unembed"] += vector_head(m, B, T, reads, task.token_dim)
    else:
        trained_input = m.train_embeddings or m.positions == "learned"
        parts["embed/unembed"] += token_head(m, B, T, reads, task.vocab_size)
    if m.positions == "learned":
        parts["embed/unembed"] += 2 * B * T * D  # the add, and the table's gradient summed over the batch
    for layer, mixer in enumerate(cfg.layers):  # a hybrid's layers each counted as their row counts its own
        last = layer == m.depth - 1
        parts.update(block(dataclasses.replace(cfg, mixer=mixer), B, T, Q if last else None,
                           layer > 0 or trained_input, loop_bodies_once))
    parts["loss"] += B * reads * (TOKEN_LOSS * loss_logits(task) if task.input_kind == "tokens" else 7)
    parts["optimizer"] += optimizer(cfg)
    parts = {name: float(flops) for name, flops in parts.items() if flops}
    return {**parts, "total": sum(parts.values())}


def microbatches(train) -> int:
    """How many slices tmem.train.step.make_gradients differentiates the batch in, one after another, on one
    device (the count is a step's on one device)."""
    return train.split(1)[0]


def scored_positions(task) -> int | None:
    """Positions per example the loss scores, where the model reads (None: all), from the shape of a batch."""
    batch = jax.eval_shape(lambda: task.sample(jax.random.key(0), 1))
    return None if batch.positions is None else batch.positions.shape[1]


def loss_logits(task) -> int:
    """Logits per scored position the token loss reads: the vocabulary, or only the values where it slices them
    (tasks.memorize scores the value tokens alone; the unembedding still makes every logit)."""
    return task.num_values if isinstance(task, Memorize) else task.vocab_size


def token_head(m, B: int, T: int, Q: int, V: int) -> int:
    """The embedding (its backward a scatter-add into the table), the final norm and the unembedding."""
    flops = B * T * m.width if m.train_embeddings else 0
    flops += norm(final_norm(m), B * Q * m.width)
    flops += matmul(B * Q, m.width, V, grads=2 if m.train_embeddings else 1)
    if m.tie_embeddings and m.train_embeddings:
        flops += V * m.width  # the two gradients of the one table added
    return flops


def vector_head(m, B: int, T: int, Q: int, token_dim: int) -> int:
    """A learned read-in (no gradient for the data) and read-out with their biases, or the identity's -y."""
    if m.read_in == "identity":
        return 2 * B * Q  # minus the last coordinate, and its gradient
    read_in = matmul(B * T, token_dim, m.width, grads=1) + 2 * B * T * m.width
    read_out = norm(final_norm(m), B * Q * m.width) + matmul(B * Q, m.width, 1) + 2 * B * Q
    return read_in + read_out


def final_norm(m) -> str:
    """The norm before the head: post-norm has none (tmem.backbone.final_norm)."""
    return "none" if m.norm_position == "post" else m.norm


def block(cfg, B: int, T: int, Q: int | None, input_grad: bool, once: bool = False) -> Counter:
    """x += mixer(norm x); x += mlp(norm x) (post-norm: x = norm(x + mixer(x)); x = norm(x + mlp(x))), with the
    mixer reading at Q positions per example (None: all)."""
    D, R = cfg.model.width, B * (Q or T)  # R: rows out of the block
    post = cfg.model.norm_position == "post"
    parts = Counter()
    if cfg.mixer.mixes:  # no mixer adds zeros, and XLA drops its norm and the add
        # pre-norm: the norm of every token before the mixer; post-norm: of the rows out, after the add, whose
        # input (the mixer's output) always needs a gradient
        parts["norms"] += norm(cfg.model.norm, R * D) if post else norm(cfg.model.norm, B * T * D, input_grad)
        # the mixer's input needs a gradient when x does, or when a norm before it has a scale and bias
        mixer_grad = input_grad or (cfg.model.norm != "none" and not post)
        # the row's own count; a row without one raises tmem.mixers.flops.Uncounted, never counts zero
        parts.update(cfg.mixer.flops(cfg.model, B, T, Q, mixer_grad, once))
        # the residual add; backward, the two gradients of x added (and, reading at Q positions, scattered back)
        parts["residual"] += R * D + (B * T * D + (R * D if Q else 0) if input_grad else 0)
    if mlp_layer(cfg.mlp) is not None:
        parts["norms"] += norm(cfg.model.norm, R * D)
        parts["mlp"] += mlp_flops(cfg.mlp, D, R)
        parts["residual"] += 2 * R * D
    return parts


def optimizer(cfg) -> int:
    """AdamW's update per parameter (weight decay on matrices only), the logged gradient norm, clipping, and
    combining the microbatches' gradients (a weighted sum over the slices)."""
    model = nnx.eval_shape(lambda: build_model(cfg, cfg.task))
    shapes = [p.shape for p in jax.tree.leaves(nnx.state(model, nnx.Param))]
    params = sum(math.prod(s) for s in shapes)
    matrices = sum(math.prod(s) for s in shapes if len(s) >= 2)
    o = cfg.optim
    flops = params * (ADAM + GRAD_NORM + (CLIP if o.clip_norm is not None else 0))
    flops += (matrices * WEIGHT_DECAY) if o.weight_decay else 0
    slices = microbatches(cfg.train)
    if slices > 1:
        flops += 2 * slices * params
    if cfg.model.tie_blocks:
        flops += (cfg.model.depth - 1) * params  # the shared block's gradients summed over its applications
    return flops
