"""The dense MLP, y = W_out s(W_in x): every hidden unit a key, its row of W_out the value (Chapter 5).

`none`, `linear`, `relu`, `relu2`, `relu3`, `gelu` and `swiglu` are this one
layer with another score function s applied to the keys' match W_in x (the
reads of tmem.memory.reads); gated scores multiply by a second, linear match.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from tmem.layers import linear
from tmem.memory.reads import SCORES as _READS
from tmem.mlps.base import MLPConfig

SCORES = {name: _READS[read] for name, read in
          (("linear", "linear"), ("relu", "relu"), ("relu2", "relu2"), ("relu3", "relu3"), ("gelu", "gelu"),
           ("swiglu", "silu"))}
GATED = {"swiglu"}


def hidden_units(expansion: float, width: int) -> int:
    return int(round(expansion * width))


def dense_parameters(width: int, hidden: int, score: str, bias: bool) -> int:
    """Parameters of y = W_out s(W_in x): a gated score's W_in has two halves."""
    n_in = 2 * hidden if score in GATED else hidden
    return width * n_in + hidden * width + ((n_in + width) if bias else 0)


@dataclasses.dataclass(frozen=True)
class DenseConfig(MLPConfig):
    expansion: float = 4.0  # hidden units per model width
    bias: bool = False

    def __post_init__(self):
        if self.expansion <= 0:
            raise ValueError(f"mlp.expansion={self.expansion} must be positive")

    def parameters(self, width: int) -> tuple[int, int]:
        if self.name == "none":
            return 0, 0
        n = dense_parameters(width, hidden_units(self.expansion, width), self.name, self.bias)
        return n, n


def score(h: jax.Array, name: str) -> jax.Array:
    """s(h); a gated score reads h as [match, gate] halves: s(match) * gate."""
    if name in GATED:
        h, gate = jnp.split(h, 2, axis=-1)
        return SCORES[name](h) * gate
    return SCORES[name](h)


class Dense(nnx.Module):
    """y = W_out s(W_in x): hidden units are keys, W_out rows their values."""

    def __init__(self, cfg: DenseConfig, width: int, *, rngs: nnx.Rngs):
        self.score = cfg.name
        hidden = hidden_units(cfg.expansion, width)
        n_in = 2 * hidden if cfg.name in GATED else hidden
        self.w_in = linear(width, n_in, bias=cfg.bias, rngs=rngs)
        self.w_out = linear(hidden, width, bias=cfg.bias, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        """The hidden activation, the key that W_out reads (Chapter 14), is sown as `hidden`."""
        h = score(self.w_in(x), self.score)
        self.sow(nnx.Intermediate, "hidden", h, capture_noop=True)
        return self.w_out(h)
