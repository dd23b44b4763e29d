"""Softmax attention: the exponential read over a store that grows by one pair per token."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import nnx, struct

from tmem.layers import rope
from tmem.memory import softmax_read
from tmem.mixers.base import Mixer, MixerConfig, MixerState, at_positions, mask_heads


@dataclasses.dataclass(frozen=True)
class SoftmaxConfig(MixerConfig):
    name: str = "softmax"
    heads: int = 4
    temperature: float | None = None  # beta; None means 1/sqrt(head width)
    qk_norm: bool = False  # RMSNorm on each head's query and key before RoPE
    bias: bool = False
    rope_base: float = 10_000.0

    applies_rope: ClassVar[bool] = True
    takes_qk_positions: ClassVar[bool] = True

    def check(self, width: int) -> None:
        if self.heads < 1 or width % self.heads:
            raise ValueError(f"mixer.heads={self.heads} must divide model.width={width}")

    def state_size(self, width: int, seq_len: int) -> int:
        """Keys and values of every token seen: 2 * width per token."""
        return 2 * width * seq_len

    def state_size_per_token(self, width: int) -> int | None:
        return 2 * width


@struct.dataclass
class KVCache(MixerState):
    """Softmax attention's store: the keys (already rotated) and values [B, S, H, d] of the tokens read."""

    keys: jax.Array
    values: jax.Array


class SoftmaxAttention(Mixer):
    """Causal multi-head softmax attention.

    The state is the key-value cache, so a call can continue from an earlier
    one. Per-head attention weights are sown as the `attention` intermediate.
    """

    def __init__(self, cfg: SoftmaxConfig, width: int, *, rope: bool, rngs: nnx.Rngs):
        self.cfg, self.rope = cfg, rope
        self.heads, self.d_head = cfg.heads, width // cfg.heads
        self.qkv = nnx.Linear(width, 3 * width, use_bias=cfg.bias, rngs=rngs)
        self.out = nnx.Linear(width, width, use_bias=cfg.bias, rngs=rngs)
        if cfg.qk_norm:
            self.q_norm = nnx.RMSNorm(self.d_head, rngs=rngs)
            self.k_norm = nnx.RMSNorm(self.d_head, rngs=rngs)

    def __call__(self, x_btd, *, state: KVCache | None = None, head_mask=None, read_at=None, qk_positions=None):
        """The protocol's call (tmem.mixers.base.Mixer). Shortformer positions reach queries and keys only:
        attention can find positions, but values, and so the residual stream, carry none."""
        B, T, D = x_btd.shape
        H, d = self.heads, self.d_head
        kernel = self.qkv.kernel[...]
        x_qk = x_btd if qk_positions is None else x_btd + qk_positions
        k = (x_qk @ kernel[:, D:2 * D]).reshape(B, T, H, d)
        v = (x_btd @ kernel[:, 2 * D:]).reshape(B, T, H, d)
        q = (at_positions(x_qk, read_at) @ kernel[:, :D]).reshape(B, -1, H, d)
        if self.cfg.bias:
            bias = self.qkv.bias[...]
            q, k, v = q + bias[:D].reshape(H, d), k + bias[D:2 * D].reshape(H, d), v + bias[2 * D:].reshape(H, d)
        if self.cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        offset = 0 if state is None else state.length
        q_pos = offset + (jnp.arange(T) if read_at is None else read_at)
        if self.rope:
            q = rope(q, q_pos, self.cfg.rope_base)
            k = rope(k, offset + jnp.arange(T), self.cfg.rope_base)
        if state is not None:
            k = jnp.concatenate([state.keys, k], axis=1)
            v = jnp.concatenate([state.values, v], axis=1)
        # the cache holds the last S tokens read; key s is readable from query position t when s <= t
        S = k.shape[1]
        s_pos = (offset + T - S + jnp.arange(S)).reshape((1,) * q_pos.ndim + (-1,))
        mask = s_pos <= q_pos[..., None]  # [T, S] or [B, Q, S]
        mask = mask[None, None] if read_at is None else mask[:, None]
        beta = self.cfg.temperature or d**-0.5
        o_bthd, weights = softmax_read(q, k, v, mask, beta)
        self.sow(nnx.Intermediate, "attention", weights, capture_noop=True)
        o_bthd = mask_heads(o_bthd, head_mask)
        return self.out(o_bthd.reshape(B, -1, D)), KVCache(k, v, length=offset + T)
