"""Product-key memory (`mlp=pkm`, Lample et al. 2019): a table of keys^2 values read by its top_k keys.

A query q = W_q x (per head, key_width wide) is split in halves q1, q2; the
table's key (i, j) is the pair of sub-keys [c1_i, c2_j], so its score is
q1 . c1_i + q2 . c2_j. The top_k of all keys^2 scores are among the top_k x
top_k sums of each half's own top_k, so the search scores 2 x keys sub-keys
and top_k^2 candidates instead of keys^2 keys (`product_topk`; the
definition it is tested against is `brute_force_topk`). The read is a
softmax over the chosen scores weighting their values, summed over the
heads, which share the table: y = sum_h sum_i softmax(s)_i v_{index_i}.
Lample's batch norm on the query is left out. A token's forward pass uses
the query map, every sub-key and heads x top_k values: its active parameters.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from tmem.layers import linear
from tmem.mlps.base import MLPConfig


@dataclasses.dataclass(frozen=True)
class PKMConfig(MLPConfig):
    name: str = "pkm"
    keys: int = 32  # sub-keys per half: the table holds keys^2 values, each one model width wide
    top_k: int = 8  # keys read per head (and sub-keys kept per half)
    heads: int = 1  # queries per token, each with its own sub-keys, reading the one table
    key_width: int | None = None  # each query's width, split into two halves; null: the model width

    def __post_init__(self):
        checks = [
            (self.keys >= 1, f"mlp.keys={self.keys} must be positive"),
            (1 <= self.top_k <= self.keys, f"mlp.top_k={self.top_k} must be in 1..mlp.keys={self.keys}"),
            (self.heads >= 1, f"mlp.heads={self.heads} must be positive"),
            (self.key_width is None or (self.key_width > 0 and self.key_width % 2 == 0),
             f"mlp.key_width={self.key_width} must be a positive even number (two halves), or null"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    def query_width(self, width: int) -> int:
        return self.key_width or width

    def check(self, width: int) -> None:
        if self.key_width is None and width % 2:
            raise ValueError(f"mlp.key_width=null takes the model width {width}, which is odd: the query splits in "
                             "two halves; set mlp.key_width to an even number")

    def parameters(self, width: int) -> tuple[int, int]:
        search = self.heads * self.query_width(width) * (width + self.keys)  # W_q and both halves' sub-keys
        return search + self.heads * self.top_k * width, search + self.keys ** 2 * width


def product_topk(q: jax.Array, c1: jax.Array, c2: jax.Array, top_k: int) -> tuple[jax.Array, jax.Array]:
    """(scores, indices i * n + j) [..., H, top_k] of the top_k keys of queries q [..., H, d] among the n^2 keys
    [c1_i, c2_j] of sub-keys c1, c2 [H, n, d/2], by product keys: each half's top_k, then the best of their sums."""
    half, n = q.shape[-1] // 2, c1.shape[-2]
    s1, i1 = jax.lax.top_k(jnp.einsum("...hd,hnd->...hn", q[..., :half], c1), top_k)
    s2, i2 = jax.lax.top_k(jnp.einsum("...hd,hnd->...hn", q[..., half:], c2), top_k)
    sums = (s1[..., :, None] + s2[..., None, :]).reshape(*s1.shape[:-1], top_k * top_k)
    pairs = (i1[..., :, None] * n + i2[..., None, :]).reshape(sums.shape)
    scores, chosen = jax.lax.top_k(sums, top_k)
    return scores, jnp.take_along_axis(pairs, chosen, axis=-1)


def brute_force_topk(q: jax.Array, c1: jax.Array, c2: jax.Array, top_k: int) -> tuple[jax.Array, jax.Array]:
    """The definition: every one of the n^2 keys scored, and their top_k."""
    half, n = q.shape[-1] // 2, c1.shape[-2]
    s1 = jnp.einsum("...hd,hnd->...hn", q[..., :half], c1)
    s2 = jnp.einsum("...hd,hnd->...hn", q[..., half:], c2)
    return jax.lax.top_k((s1[..., :, None] + s2[..., None, :]).reshape(*s1.shape[:-1], n * n), top_k)


def memory_read(scores: jax.Array, index: jax.Array, values: jax.Array) -> jax.Array:
    """sum over heads and chosen keys of softmax(scores) * values[index]: scores, index [..., H, k] -> [..., D]."""
    w = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(values.dtype)
    return jnp.einsum("...hk,...hkd->...d", w, values[index])


class ProductKeyMemory(nnx.Module):
    """W_q, two sets of sub-keys per head, and a table of keys^2 values; y of [..., width] position by position."""

    def __init__(self, cfg: PKMConfig, width: int, *, rngs: nnx.Rngs):
        self.cfg = cfg
        H, d = cfg.heads, cfg.query_width(width)
        self.query = linear(width, H * d, bias=False, rngs=rngs)
        sub_key = nnx.initializers.normal((d // 2) ** -0.5)  # a score of about 1 per half for a unit query
        self.sub_keys_1 = nnx.Param(sub_key(rngs.params(), (H, cfg.keys, d // 2)))
        self.sub_keys_2 = nnx.Param(sub_key(rngs.params(), (H, cfg.keys, d // 2)))
        self.values = nnx.Param(nnx.initializers.normal(width ** -0.5)(rngs.params(), (cfg.keys ** 2, width)))

    def __call__(self, x: jax.Array) -> jax.Array:
        q = self.query(x).reshape(*x.shape[:-1], self.cfg.heads, -1)
        scores, index = product_topk(q, self.sub_keys_1[...], self.sub_keys_2[...], self.cfg.top_k)
        return memory_read(scores, index, self.values[...])
