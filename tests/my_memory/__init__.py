"""A memory from outside tmem: a decayed outer-product memory, S_t = a S_{t-1} + k_t v_t^T, read y_t = q_t S_t.

The example of docs/add-a-memory.md. tmem knows nothing of this package: its
YAML, configs/mixer/decayed.yaml beside it, names `ROW` by import path, and
tests/test_outside_row.py trains, continues and restores it.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx, struct

from tmem.memory.linear_state import recurrent
from tmem.mixers import Row
from tmem.mixers.base import (Mixer, MixerConfig, MixerState, Recipe, Run, at_positions, check_knobs, mask_heads,
                              recommended, run_field)


@dataclasses.dataclass(frozen=True)
class DecayedRun(Run):
    """How it computes (mixer.run.*): the same function either way, so a resume may change it."""

    form: str = "parallel"  # parallel (masked matmuls) | recurrent (the definition, tmem's token scan)


@dataclasses.dataclass(frozen=True)
class DecayedConfig(MixerConfig):
    name: str = "decayed"
    recipe: Recipe = recommended(lr=1e-2, microbatch=16)  # how it trains best (mixer.recipe.*)
    run: DecayedRun = run_field(DecayedRun)
    heads: int = 2  # the memory's knobs (mixer.*)
    decay: float = 0.9  # a: how much of the memory each token keeps

    def check(self, width: int) -> None:
        check_knobs(self, choices={"run.form": ("parallel", "recurrent")}, width=width)
        if not 0 < self.decay <= 1:
            raise ValueError(f"mixer.decay={self.decay} must be in (0, 1]")

    def state_size(self, width: int, seq_len: int) -> int:
        return width * width // self.heads  # H matrices of d x d


@struct.dataclass
class DecayedState(MixerState):
    memory: jax.Array  # S [B, H, d, d], key-major

    def matrix(self, layer: Decayed) -> jax.Array:
        return self.memory


def decayed_read(q, k, v, positions, a: float, S0=None):
    """The parallel form: y_p = sum_{s<=p} a^(p-s) (q_p . k_s) v_s + a^(p+1) q_p S0, and the final state.
    q [B, Q, H, d] at `positions` ([Q] or [B, Q]) of the call's T tokens; k, v [B, T, H, d]."""
    T, positions = k.shape[1], jnp.atleast_2d(positions)  # [B or 1, Q]
    gap = positions[:, :, None] - jnp.arange(T)[None, None, :]
    weights = jnp.where(gap >= 0, a ** jnp.maximum(gap, 0), 0.0)[:, None]  # [B or 1, 1, Q, T]
    y = jnp.einsum("bhqt,bthe->bqhe", jnp.einsum("bqhd,bthd->bhqt", q, k) * weights, v)
    S = jnp.einsum("bthd,bthe->bhde", k * (a ** (T - 1 - jnp.arange(T)))[None, :, None, None], v)
    if S0 is not None:
        y += (a ** (positions + 1.0))[:, :, None, None] * jnp.einsum("bqhd,bhde->bqhe", q, S0)
        S += a**T * S0
    return y, S


class Decayed(Mixer):
    sows = frozenset({"keys"})  # what the state probes read beside the matrix

    def __init__(self, cfg: DecayedConfig, width: int, *, rope: bool, rngs: nnx.Rngs):
        del rope  # validation refuses model.positions=rope: the config does not declare applies_rope
        self.cfg, self.heads = cfg, cfg.heads
        self.qkv = nnx.Linear(width, 3 * width, use_bias=False, rngs=rngs)
        self.out = nnx.Linear(width, width, use_bias=False, rngs=rngs)

    def __call__(self, x_btd, *, state=None, head_mask=None, read_at=None, qk_positions=None):
        B, T, D = x_btd.shape
        q, k, v = jnp.split(self.qkv(x_btd).reshape(B, T, 3 * self.heads, D // self.heads), 3, axis=2)
        self.sow(nnx.Intermediate, "keys", k, capture_noop=True)
        S0 = None if state is None else state.memory
        if self.cfg.run.form == "recurrent":
            y, S = recurrent(q, k, v, log_a=jnp.full((1, T, self.heads, 1), jnp.log(self.cfg.decay)), state=S0)
            y = at_positions(y, read_at)
        else:
            positions = jnp.arange(T) if read_at is None else read_at
            y, S = decayed_read(at_positions(q, read_at), k, v, positions, self.cfg.decay, S0)
        y = mask_heads(y, head_mask).reshape(B, -1, D)
        return self.out(y), DecayedState(S, length=T + (0 if state is None else state.length))


ROW = Row(DecayedConfig, Decayed)  # what the YAML's _row_ names
