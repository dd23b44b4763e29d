"""No mixer: a block that reads no other token, so the MLP is the only memory (the slow one)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp
from flax import nnx


@dataclasses.dataclass(frozen=True)
class NoneConfig:
    name: str = "none"
    lr: float = 1e-2  # used when optim.lr is null; the memorize experiment's rate

    applies_rope: ClassVar[bool] = False

    def check(self, width: int) -> None:
        pass

    def state_size(self, width: int, seq_len: int) -> int:
        return 0

    def state_size_per_token(self, width: int) -> int:
        return 0


class NoMixer(nnx.Module):
    """Adds nothing to the residual stream; each position is computed on its own."""

    def __init__(self, cfg: NoneConfig, width: int, *, rope: bool, rngs: nnx.Rngs):
        del cfg, width, rope, rngs

    def __call__(self, x_btd, *, state=None, head_mask=None, read_at=None):
        if read_at is not None:
            x_btd = jnp.take_along_axis(x_btd, read_at[..., None], axis=1)
        return jnp.zeros_like(x_btd), None
