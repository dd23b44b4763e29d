"""Softmax attention: the exponential read over a store that grows by one pair per token, and its variants.

The variants are switches of one layer (Chapters 3 and 6): grouped-query
keys and values (kv_heads), a sliding window whose cache keeps only what a
later query can see, length scaling of the logits (log n; Scalable-Softmax),
attention sinks, a gated output, and q/k normalisation.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import nnx, struct

from tmem.layers import linear, rope
from tmem.memory import softmax_read
from tmem.memory.softmax import fused_read, logn_scale, ssmax_scale, visible_keys
from tmem.mixers import flops as count
from tmem.mixers.base import (GATE_ACTIVATIONS, Cell, Mixer, MixerConfig, MixerState, NoMatrix, at_positions,
                              Run, check_temperature, knob, mask_heads, run_field)

QK_NORMS = ("none", "rms", "l2")
LENGTH_SCALES = ("none", "logn", "ssmax")
IMPLEMENTATIONS = ("auto", "plain", "fused")
TIES = ("none", "kv", "qk")


@dataclasses.dataclass(frozen=True)
class SoftmaxRun(Run):
    # how the read is computed: plain (einsums, the weights formed and sown), fused (jax.nn.dot_product_attention:
    # cuDNN's flash attention on a GPU), auto (fused on an accelerator, plain on a CPU, where the fused one is no
    # faster). The read is the same either way; fused applies only where nothing needs the weights (no probe
    # capturing them, no sinks) and to whole sequences (no cache, every position read)
    implementation: str = "auto"


@dataclasses.dataclass(frozen=True)
class SoftmaxConfig(MixerConfig):
    name: str = "softmax"
    heads: int = 4
    kv_heads: int | None = None  # key-value heads, each read by heads / kv_heads queries (1: multi-query); None: heads
    # beta; None: 1/sqrt(head width), or sqrt(head width) with qk_norm=l2, so unit q and k give the logits'
    # range RMS-normed ones (of norm sqrt(head width)) give
    temperature: float | None = None
    qk_norm: str = "none"  # none | rms (RMSNorm with a learned gain) | l2 (unit): each head's q and k, before RoPE
    window: int | None = None  # query t reads keys s with t - window < s <= t; None: every earlier key
    # logits times: none; logn, log_L(n) for n > L (1 up to the training length L); ssmax, s_h log n with s
    # learned per head (Scalable-Softmax). n: the keys the query sees
    length_scale: str = "none"
    train_length: int | None = None  # L of length_scale; None: the task's seq_len (set by fit)
    sinks: bool = False  # a learned logit per head in every softmax's denominator, reading no value (gpt-oss)
    output_gate: bool = False  # multiply each head's read by gate_activation(W_g x) before the output map
    gate_activation: str = "sigmoid"  # sigmoid | silu
    bias: bool = False
    # two projections as one (the note, Chapter 7: what keys, values and queries each carry): none | kv (values
    # read with the keys' map, as the Hopfield row's) | qk (queries with the keys' map, a symmetric score). The
    # parameters stay those of the untied layer; the tied-away map is never read
    tie: str = "none"
    rope_base: float = 10_000.0
    run: SoftmaxRun = run_field(SoftmaxRun)

    applies_rope: ClassVar[bool] = True
    takes_qk_positions: ClassVar[bool] = True
    attention_patterns: ClassVar[bool] = True

    def check(self, width: int) -> None:
        for field, allowed in (("qk_norm", QK_NORMS), ("length_scale", LENGTH_SCALES),
                               ("gate_activation", tuple(GATE_ACTIVATIONS)), ("run.implementation", IMPLEMENTATIONS),
                               ("tie", TIES)):
            value = knob(self, field)
            if value not in allowed:
                was = " (it was a bool: true is rms, false none)" if value in ("True", "False", True, False) else ""
                raise ValueError(f"mixer.{field}={value!r} is not one of: {', '.join(allowed)}{was}")
        if self.heads < 1 or width % self.heads:
            raise ValueError(f"mixer.heads={self.heads} must divide model.width={width}")
        check_temperature(self.temperature)
        if self.tie == "qk" and self.kv_heads not in (None, self.heads):
            raise ValueError(f"mixer.tie=qk needs a key head per query head: set mixer.kv_heads=null, not "
                             f"{self.kv_heads}")
        if self.kv_heads is not None and (self.kv_heads < 1 or self.heads % self.kv_heads):
            raise ValueError(f"mixer.kv_heads={self.kv_heads} must divide mixer.heads={self.heads} (or be null)")
        for field in ("window", "train_length"):
            value = getattr(self, field)
            if value is not None and value < 1:
                raise ValueError(f"mixer.{field}={value} must be positive or null")
        if self.length_scale != "none" and self.train_length is not None and self.train_length < 2:
            raise ValueError(f"mixer.train_length={self.train_length} must be at least 2 with "
                             f"length_scale={self.length_scale}: log 1 is 0")

    def fit(self, task, width: int) -> SoftmaxConfig:
        """The training length of length_scale is the task's, unless set."""
        return self if self.train_length is not None else dataclasses.replace(self, train_length=task.seq_len)

    def cell(self) -> Cell:
        """The slides' last row: weights by similarity to the query, exp(beta q . k_i), and the locally constant
        (non-parametric) fit, whose exact minimiser is the weighted mean of the values, over an empty cache."""
        return "similarity", "nonparametric", "exact", "zero"

    def at_cell(self, cell: Cell, mini_batch: int, heads: int, write_strength: str | None = None
                ) -> SoftmaxConfig | None:
        """Only its own cell, and no write strength: every pair is cached alike."""
        if cell != self.cell() or write_strength == "learned":
            return None
        return dataclasses.replace(self, heads=heads)

    def beta(self, d_head: int) -> float:
        """The logits' scale: the temperature, else 1/sqrt(d_head), or sqrt(d_head) for unit (l2) q and k."""
        if self.temperature is not None:
            return self.temperature
        return d_head**0.5 if self.qk_norm == "l2" else d_head**-0.5

    def kv_width(self, width: int) -> int:
        """Key (and value) width over all key-value heads."""
        return (self.kv_heads or self.heads) * (width // self.heads)

    def cached_tokens(self, seq_len: int) -> int:
        """Tokens the cache holds after seq_len: all of them, or the window's last window - 1."""
        return seq_len if self.window is None else min(seq_len, self.window - 1)

    def state_size(self, width: int, seq_len: int) -> int:
        """Keys and values of the tokens cached: 2 * kv width per token."""
        return 2 * self.kv_width(width) * self.cached_tokens(seq_len)

    def state_size_per_token(self, width: int) -> int | None:
        return None if self.window is not None else 2 * self.kv_width(width)

    def flops(self, model, B: int, T: int, Q: int | None, input_grad: bool, once: bool = False) -> Counter:
        """Q only at the read positions, k and v everywhere (kv_heads of them),
        softmax(beta q k^T) v, and the options: q/k norms, window, length scale, sinks, output gate."""
        c, D = self, model.width
        H, d, R = c.heads, D // c.heads, B * (Q or T)
        E = c.kv_width(D)
        shortformer = model.positions == "shortformer"
        qk_grads = 2 if input_grad or shortformer else 1  # the positions' table trains through q's and k's input
        parts = Counter()
        parts["mixer/projections"] += (count.matmul(B * T, D, E, qk_grads) + count.matmul(R, D, D, qk_grads)
                                       + count.matmul(B * T, D, E, 2 if input_grad else 1) + count.matmul(R, D, D))
        if c.bias:
            parts["mixer/projections"] += 2 * (2 * B * T * E + R * D)
        if shortformer:  # x + positions into q and k; backward, the table's gradient summed over the batch
            parts["embed/unembed"] += 2 * B * T * D
        if c.qk_norm == "rms":
            parts["norms"] += count.norm("rmsnorm", B * T * E + R * D)
        elif c.qk_norm == "l2":
            parts["norms"] += count.elementwise(B * T * E + R * D, count.L2_UNIT)
        if model.positions == "rope":
            parts["mixer/memory"] += 6 * (B * T * E + R * D)  # x1 cos - x2 sin, x2 cos + x1 sin, and back
        scores = R * H * T
        columns = T + c.sinks  # a sink is one more column in each softmax
        parts["mixer/memory"] += (count.matmul(R * H, d, T) + count.matmul(R * H, T, d)
                                  # beta *, the causal where
                                  + count.elementwise(R * H * columns, count.SOFTMAX) + 4 * scores
                                  + (R * T * (3 if c.window else 1) if Q else 0))  # the mask at read positions
        if c.sinks:
            parts["mixer/memory"] += R * H  # the sinks' gradient summed over the rows
        if c.length_scale == "logn":  # the logits times a factor per query, and the gradient through it
            parts["mixer/memory"] += 2 * scores
        elif c.length_scale == "ssmax":  # and the gradient of s: the product and the sum over the keys
            parts["mixer/memory"] += 4 * scores
        if c.output_gate:  # W_g x at the read positions, its activation, the product and its two gradients
            activation = count.SILU if c.gate_activation == "silu" else count.SIGMOID
            parts["mixer/projections"] += count.matmul(R, D, D, 2 if input_grad else 1)
            parts["mixer/gates"] += count.elementwise(R * D, activation) + 3 * R * D
        return parts


@struct.dataclass
class KVCache(MixerState):
    """Softmax attention's store: keys (already rotated) and values [B, S, kv heads, d] of the last S tokens read."""

    keys: jax.Array
    values: jax.Array

    def matrix(self, layer: SoftmaxAttention) -> jax.Array:
        raise NoMatrix("a KV cache, one key and value per token")


def _unit(x):
    """x / sqrt(|x|^2 + 1e-6) along the last axis."""
    return x * jax.lax.rsqrt(jnp.sum(jnp.square(x), axis=-1, keepdims=True) + 1e-6)


def _per_query(x, heads: bool):
    """A value per query, [T] or [B, Q] (with a trailing [H] when heads), laid out as the scores [B, H, T, 1]."""
    if heads:
        x = jnp.moveaxis(x, -1, -2)  # [H, T] or [B, H, Q]
        return x.reshape((1,) * (4 - x.ndim - 1) + x.shape + (1,))
    return x.reshape((1, 1, -1, 1) if x.ndim == 1 else (x.shape[0], 1, x.shape[1], 1))


def readable(q_pos, end: int, S: int, window: int | None = None):
    """Which of a cache's keys each query reads, laid out as the scores [B or 1, 1, T, S]: the cache holds the
    S tokens before position `end`, and key s is readable from query position t (q_pos, [T] or [B, Q]) when
    s <= t, and t - window < s with a window."""
    s_pos = (end - S + jnp.arange(S)).reshape((1,) * q_pos.ndim + (-1,))
    mask = s_pos <= q_pos[..., None]  # [T, S] or [B, Q, S]
    if window is not None:
        mask = mask & (s_pos > q_pos[..., None] - window)
    return mask[None, None] if q_pos.ndim == 1 else mask[:, None]


class SoftmaxAttention(Mixer):
    """Causal multi-head softmax attention.

    The state is the key-value cache, so a call can continue from an earlier
    one. Per-head attention weights are sown as the `attention` intermediate.
    """

    # with the weights, what the keys_move probe reads off the plain read: the queries, keys and values the
    # weights were formed from ([B, T, H or kv heads, d], rotated and normed as read), and the gradient of the
    # loss at each head's read (the `read` perturbation, nnx.Perturbation: zero unless a probe captures it)
    sows = frozenset({"attention", "queries", "keys", "values"})

    def __init__(self, cfg: SoftmaxConfig, width: int, *, rope: bool, rngs: nnx.Rngs):
        self.cfg, self.rope = cfg, rope
        self.heads, self.d_head = cfg.heads, width // cfg.heads
        self.kv_heads = cfg.kv_heads or cfg.heads
        self.qkv = linear(width, width + 2 * cfg.kv_width(width), bias=cfg.bias, rngs=rngs)
        self.out = linear(width, width, bias=cfg.bias, rngs=rngs)
        if cfg.qk_norm == "rms":
            self.q_norm = nnx.RMSNorm(self.d_head, rngs=rngs)
            self.k_norm = nnx.RMSNorm(self.d_head, rngs=rngs)
        # drawn after every parameter the plain layer has, so with these off it initialises as it always did
        if cfg.output_gate:
            self.gate = linear(width, width, bias=cfg.bias, rngs=rngs)
        if cfg.sinks:
            self.sinks = nnx.Param(jnp.zeros((cfg.heads,)))
        if cfg.length_scale == "ssmax":
            if cfg.train_length is None:
                raise ValueError("mixer.train_length is null: validate the config (its fit sets the task's length)")
            # s log L = 1: at the training length the read starts as plain softmax's (the paper's init was not
            # recovered; this one makes the option change nothing at step 0 where the task is trained)
            self.ssmax_scale = nnx.Param(jnp.full((cfg.heads,), 1 / math.log(cfg.train_length)))

    def qkv_maps(self, w):
        """The q, k and v parts of the fused kernel [D, D + 2E] (or bias) as the layer reads them: W_Q [D, D],
        W_K and W_V [D, E], two of them the same map under mixer.tie."""
        D, E = self.heads * self.d_head, self.kv_heads * self.d_head
        q, k, v = w[..., :D], w[..., D:D + E], w[..., D + E:]
        return (k if self.cfg.tie == "qk" else q), k, (k if self.cfg.tie == "kv" else v)

    def __call__(self, x_btd, *, state: KVCache | None = None, head_mask=None, read_at=None, qk_positions=None):
        """The protocol's call (tmem.mixers.base.Mixer). Shortformer positions reach queries and keys only:
        attention can find positions, but values, and so the residual stream, carry none."""
        cfg, (B, T, D) = self.cfg, x_btd.shape
        H, G, d = self.heads, self.kv_heads, self.d_head
        E = G * d
        W_q, W_k, W_v = self.qkv_maps(self.qkv.kernel[...])
        x_qk = x_btd if qk_positions is None else x_btd + qk_positions
        k = (x_qk @ W_k).reshape(B, T, G, d)
        v = (x_btd @ W_v).reshape(B, T, G, d)
        q = (at_positions(x_qk, read_at) @ W_q).reshape(B, -1, H, d)
        if cfg.bias:
            b_q, b_k, b_v = self.qkv_maps(self.qkv.bias[...])
            q, k, v = q + b_q.reshape(1, 1, H, d), k + b_k.reshape(1, 1, G, d), v + b_v.reshape(1, 1, G, d)
        if cfg.qk_norm == "rms":
            q, k = self.q_norm(q), self.k_norm(k)
        elif cfg.qk_norm == "l2":
            q, k = _unit(q), _unit(k)
        offset = 0 if state is None else state.length
        q_pos = offset + (jnp.arange(T) if read_at is None else read_at)
        if self.rope:
            q = rope(q, q_pos, cfg.rope_base)
            k = rope(k, offset + jnp.arange(T), cfg.rope_base)
        if state is not None:
            k = jnp.concatenate([state.keys, k], axis=1)
            v = jnp.concatenate([state.values, v], axis=1)
        S = k.shape[1]
        mask = readable(q_pos, offset + T, S, cfg.window)
        scale = None
        if cfg.length_scale != "none":
            n = visible_keys(q_pos, cfg.window)
            scale = (_per_query(logn_scale(n, cfg.train_length), heads=False) if cfg.length_scale == "logn"
                     else _per_query(ssmax_scale(n, self.ssmax_scale[...]), heads=True))
        beta = cfg.beta(d)
        if self._fused(state, read_at):
            o_bthd = fused_read(q, k, v, beta, window=cfg.window,
                                q_scale=None if scale is None else jnp.moveaxis(scale, 1, 2))
        else:
            o_bthd, weights = softmax_read(q, k, v, mask, beta, scale=scale,
                                           sink_h=self.sinks[...] if cfg.sinks else None)
            self.sow(nnx.Intermediate, "attention", weights, capture_noop=True)
            for name, value in (("queries", q), ("keys", k), ("values", v)):
                self.sow(nnx.Intermediate, name, value, capture_noop=True)
            o_bthd = self.perturb("read", o_bthd, capture_noop=True)
        if cfg.output_gate:
            gate = GATE_ACTIVATIONS[cfg.gate_activation](self.gate(at_positions(x_btd, read_at)))
            o_bthd = o_bthd * gate.reshape(o_bthd.shape)
        o_bthd = mask_heads(o_bthd, head_mask)
        if cfg.window is not None:
            # a later query at t >= offset + T sees keys s > t - window, so only the last window - 1 are ever read
            # again: the cache stays that size however long the continuation
            keep = cfg.cached_tokens(S)
            k, v = k[:, S - keep:], v[:, S - keep:]
        return self.out(o_bthd.reshape(B, -1, D)), KVCache(k, v, length=offset + T)

    def circuit_weights(self) -> tuple[jax.Array, int]:
        """W_Q, W_K, W_V side by side [D, D + 2 kv width] and the key-value heads: what the weight-only probes
        read (tmem.probes.circuits), two of them the same map under mixer.tie."""
        return jnp.concatenate(self.qkv_maps(self.qkv.kernel[...]), axis=1), self.kv_heads

    def _fused(self, state, read_at) -> bool:
        """Whether this call reads through jax.nn.dot_product_attention (SoftmaxRun.implementation).

        Not while `nnx.capture` collects intermediates (a probe reading the
        weights: flax keeps the capture on the module as `__captures__`), not
        with sinks (no column of the fused kernel reads nothing), and not for a
        continuation or a read at chosen positions, whose masks are not causal
        from position 0.
        """
        choice = self.cfg.run.implementation
        if choice == "plain" or (choice == "auto" and jax.default_backend() == "cpu"):
            return False
        return not (hasattr(self, "__captures__") or self.cfg.sinks or state is not None or read_at is not None)
