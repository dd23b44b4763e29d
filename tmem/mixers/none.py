"""No mixer: a block that reads no other token, so the MLP is the only memory (the slow one)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import ClassVar

import jax.numpy as jnp

from tmem.mixers.base import Mixer, MixerConfig, MixerState, at_positions


@dataclasses.dataclass(frozen=True)
class NoneConfig(MixerConfig):
    name: str = "none"  # lr: 1e-2, the memorize experiment's rate

    mixes: ClassVar[bool] = False

    def state_size(self, width: int, seq_len: int) -> int:
        return 0

    def state_size_per_token(self, width: int) -> int:
        return 0

    def flops(self, model, B: int, T: int, Q: int | None, input_grad: bool, once: bool = False) -> Counter:
        return Counter()  # it adds zeros, which XLA drops with the norm before it and the add after


class NoMixer(Mixer):
    """Adds nothing to the residual stream; each position is computed on its own.

    Its state holds no memory, only the count of tokens read, so a model
    without a mixer continues (its positions carry on) like any other.
    """

    def __init__(self, cfg: NoneConfig, width: int, *, rope: bool, rngs):
        del cfg, width, rope, rngs

    def __call__(self, x_btd, *, state: MixerState | None = None, head_mask=None, read_at=None, qk_positions=None):
        length = x_btd.shape[1] + (0 if state is None else state.length)
        return jnp.zeros_like(at_positions(x_btd, read_at)), MixerState(length=length)
