"""The Hopfield row: softmax retrieval from stored patterns that are keys and values at once (Chapter 6, D8).

Each token writes one pattern x_s = W_X y_s per head; each query's cue
xi = W_Q y_t is updated `iterations` times by xi <- X^T softmax(beta X xi) over
the patterns of the tokens up to its own, and the last xi is the read. One
update is softmax attention with the value map tied to the key map.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import nnx, struct

from tmem.layers import linear
from tmem.memory.hopfield import hopfield_read
from tmem.mixers import flops as count
from tmem.mixers.base import (Mixer, MixerConfig, MixerState, NoMatrix, Recipe, at_positions, check_temperature,
                              mask_heads, recommended)


@dataclasses.dataclass(frozen=True)
class HopfieldConfig(MixerConfig):
    name: str = "hopfield"
    # the default job stalls at 0.25 held-out accuracy for 1,400 steps at 1e-2 (seed 0); 3e-3 learns it
    recipe: Recipe = recommended(lr=3e-3)
    heads: int = 4
    temperature: float | None = None  # beta; None means 1/sqrt(head width)
    learn_temperature: bool = False  # beta a parameter per head (kept as its log), starting at temperature
    # updates of each cue, each differentiated through; 1 is one attention read. Iterating to a tolerance is
    # not a field: it has no gradient, so only evaluation turns it on, on a built model (converge below)
    iterations: int = 1
    bias: bool = False

    # Shortformer positions go into the cue's and the patterns' inputs; the patterns are also the values, so
    # here (unlike softmax attention) the read carries positions too. No RoPE: rotating a pattern would rotate
    # the value it returns.
    takes_qk_positions: ClassVar[bool] = True

    def check(self, width: int) -> None:
        if self.heads < 1 or width % self.heads:
            raise ValueError(f"mixer.heads={self.heads} must divide model.width={width}")
        if self.iterations < 1:
            raise ValueError(f"mixer.iterations={self.iterations} must be at least 1 (one update is one read)")
        check_temperature(self.temperature, learned=self.learn_temperature)

    def state_size(self, width: int, seq_len: int) -> int:
        """One pattern of the width per token: half a key-value cache."""
        return width * seq_len

    def state_size_per_token(self, width: int) -> int | None:
        return width

    def flops(self, model, B: int, T: int, Q: int | None, input_grad: bool, once: bool = False) -> Counter:
        """The cue only at the read positions, the patterns everywhere, and `iterations`
        updates xi <- X^T softmax(beta X xi), each a softmax read unrolled (so no loop hides one from XLA)."""
        c, D = self, model.width
        H, d, R = c.heads, D // c.heads, B * (Q or T)
        shortformer = model.positions == "shortformer"
        grads = 2 if input_grad or shortformer else 1  # the positions' table trains through both inputs
        parts = Counter()
        parts["mixer/projections"] += (count.matmul(B * T, D, D, grads) + count.matmul(R, D, D, grads)
                                       + count.matmul(R, D, D))
        if c.bias:
            parts["mixer/projections"] += 2 * (B * T * D + R * D)
        if shortformer:  # x + positions into both maps; backward, the table's gradient summed over the batch
            parts["embed/unembed"] += 2 * B * T * D
        scores = R * H * T
        update = (count.matmul(R * H, d, T) + count.matmul(R * H, T, d) + count.elementwise(scores, count.SOFTMAX)
                  + 4 * scores)
        if c.learn_temperature:  # beta's gradient: the product with the scores and the sum over them
            update += 2 * scores
        parts["mixer/memory"] += c.iterations * update + (R * T if Q else 0)
        if c.iterations > 1:  # every later update's cue gradient adds to the X it read from
            parts["mixer/memory"] += (c.iterations - 1) * R * H * d
        return parts


@struct.dataclass
class PatternStore(MixerState):
    """The stored patterns [B, S, H, d] of the tokens read."""

    patterns: jax.Array

    def matrix(self, layer: Hopfield) -> jax.Array:
        raise NoMatrix("a cache of patterns")


class Hopfield(Mixer):
    """Causal multi-head Hopfield retrieval; the state is the pattern store, so a call continues an earlier one.

    The last update's weights are sown as the `attention` intermediate, and the
    number of updates as `iterations`.
    """

    sows = frozenset({"attention", "iterations"})

    def __init__(self, cfg: HopfieldConfig, width: int, *, rope: bool, rngs: nnx.Rngs):
        del rope  # not applied: see HopfieldConfig
        self.cfg = cfg
        self.heads, self.d_head = cfg.heads, width // cfg.heads
        self.cue = linear(width, width, bias=cfg.bias, rngs=rngs)
        self.patterns = linear(width, width, bias=cfg.bias, rngs=rngs)
        self.out = linear(width, width, bias=cfg.bias, rngs=rngs)
        self.beta = cfg.temperature if cfg.temperature is not None else self.d_head ** -0.5
        if cfg.learn_temperature:
            self.log_beta = nnx.Param(jnp.full((cfg.heads,), math.log(self.beta)))
        self.converge_to: tuple[float, int] | None = None  # (tolerance, most updates), for evaluation: converge

    def __call__(self, x_btd, *, state: PatternStore | None = None, head_mask=None, read_at=None, qk_positions=None):
        """The protocol's call (tmem.mixers.base.Mixer)."""
        B, T, D = x_btd.shape
        H, d = self.heads, self.d_head
        x_in = x_btd if qk_positions is None else x_btd + qk_positions
        patterns = self.patterns(x_in).reshape(B, T, H, d)
        xi = self.cue(at_positions(x_in, read_at)).reshape(B, -1, H, d)
        offset = 0 if state is None else state.length
        if state is not None:
            patterns = jnp.concatenate([state.patterns, patterns], axis=1)
        # the store holds the last S tokens read; pattern s is readable from query position t when s <= t
        S = patterns.shape[1]
        q_pos = offset + (jnp.arange(T) if read_at is None else read_at)
        s_pos = (offset + T - S + jnp.arange(S)).reshape((1,) * q_pos.ndim + (-1,))
        mask = s_pos <= q_pos[..., None]
        mask = mask[None, None] if read_at is None else mask[:, None]
        beta = jnp.exp(self.log_beta[...]).reshape(1, H, 1, 1) if self.cfg.learn_temperature else self.beta
        tolerance, iterations = self.converge_to or (None, self.cfg.iterations)
        xi, weights, n = hopfield_read(xi, patterns, mask, beta, iterations, tolerance)
        self.sow(nnx.Intermediate, "attention", weights, capture_noop=True)
        self.sow(nnx.Intermediate, "iterations", n, capture_noop=True)
        xi = mask_heads(xi, head_mask)
        return self.out(xi.reshape(B, -1, D)), PatternStore(patterns, length=offset + T)


def converge(model: nnx.Module, tolerance: float | None, max_iterations: int = 100) -> int:
    """Make every Hopfield layer of a built model iterate each read until an update moves it by less than
    `tolerance` (at most max_iterations updates); None restores the config's fixed count. For evaluation:
    the loop's length depends on the data, so it has no reverse-mode gradient. Returns the layers changed."""
    layers = [m for _, m in nnx.iter_modules(model) if isinstance(m, Hopfield)]
    for layer in layers:
        layer.converge_to = None if tolerance is None else (tolerance, max_iterations)
    return len(layers)
