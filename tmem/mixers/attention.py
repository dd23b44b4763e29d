"""Softmax attention: the exponential read over a store that grows by one pair per token."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from tmem.layers import rope
from tmem.memory import softmax_read


@dataclasses.dataclass(frozen=True)
class SoftmaxConfig:
    name: str = "softmax"
    heads: int = 4
    temperature: float | None = None  # beta; None means 1/sqrt(head width)
    qk_norm: bool = False  # RMSNorm on each head's query and key before RoPE
    bias: bool = False
    rope_base: float = 10_000.0

    applies_rope: ClassVar[bool] = True  # model.positions=rope rotates this mixer's q and k
    takes_qk_positions: ClassVar[bool] = True  # model.positions=shortformer adds positions to q and k inputs

    def check(self, width: int) -> None:
        if self.heads < 1 or width % self.heads:
            raise ValueError(f"mixer.heads={self.heads} must divide model.width={width}")

    def state_size(self, width: int, seq_len: int) -> int:
        """Keys and values of every token seen: 2 * width per token."""
        return 2 * width * seq_len

    def state_size_per_token(self, width: int) -> int | None:
        return 2 * width


class SoftmaxAttention(nnx.Module):
    """Causal multi-head softmax attention.

    The state is the key-value cache: keys (already rotated) and values of
    every token read so far, so a call can continue from an earlier one.
    Per-head attention weights are sown as the `attention` intermediate.
    """

    def __init__(self, cfg: SoftmaxConfig, width: int, *, rope: bool, rngs: nnx.Rngs):
        self.cfg, self.rope = cfg, rope
        self.heads, self.d_head = cfg.heads, width // cfg.heads
        self.qkv = nnx.Linear(width, 3 * width, use_bias=cfg.bias, rngs=rngs)
        self.out = nnx.Linear(width, width, use_bias=cfg.bias, rngs=rngs)
        if cfg.qk_norm:
            self.q_norm = nnx.RMSNorm(self.d_head, rngs=rngs)
            self.k_norm = nnx.RMSNorm(self.d_head, rngs=rngs)

    def __call__(self, x_btd, *, state=None, head_mask=None, read_at=None, qk_positions=None):
        """Read-out [B, T, D] and the new cache; with read_at [B, Q], only the reads at those positions.

        Keys and values are written for every token either way; reading at a few
        positions skips the other queries, which is all a last layer needs when
        the loss looks at a few positions. qk_positions [1, T, D] (shortformer)
        is added to the inputs of the query and key maps only: attention can find
        positions, but values, and so the residual stream, carry no position.
        """
        B, T, D = x_btd.shape
        H, d = self.heads, self.d_head
        kernel = self.qkv.kernel[...]
        x_qk = x_btd if qk_positions is None else x_btd + qk_positions
        k = (x_qk @ kernel[:, D:2 * D]).reshape(B, T, H, d)
        v = (x_btd @ kernel[:, 2 * D:]).reshape(B, T, H, d)
        x_q = x_qk if read_at is None else jnp.take_along_axis(x_qk, read_at[..., None], axis=1)
        q = (x_q @ kernel[:, :D]).reshape(B, -1, H, d)
        if self.cfg.bias:
            bias = self.qkv.bias[...]
            q, k, v = q + bias[:D].reshape(H, d), k + bias[D:2 * D].reshape(H, d), v + bias[2 * D:].reshape(H, d)
        if self.cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        offset = 0 if state is None else state[0].shape[1]
        q_pos = offset + (jnp.arange(T) if read_at is None else read_at)
        if self.rope:
            q = rope(q, q_pos, self.cfg.rope_base)
            k = rope(k, offset + jnp.arange(T), self.cfg.rope_base)
        if state is not None:
            k = jnp.concatenate([state[0], k], axis=1)
            v = jnp.concatenate([state[1], v], axis=1)
        # key s is readable from query position t when s <= t
        s_pos = jnp.arange(k.shape[1]).reshape((1,) * q_pos.ndim + (-1,))
        mask = s_pos <= q_pos[..., None]  # [T, S] or [B, Q, S]
        mask = mask[None, None] if read_at is None else mask[:, None]
        beta = self.cfg.temperature or d**-0.5
        o_bthd, weights = softmax_read(q, k, v, mask, beta)
        self.sow(nnx.Intermediate, "attention", weights, capture_noop=True)
        if head_mask is not None:
            o_bthd = o_bthd * head_mask[None, None, :, None].astype(o_bthd.dtype)
        return self.out(o_bthd.reshape(B, -1, D)), (k, v)
