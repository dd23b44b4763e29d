"""Linear self-attention (von Oswald et al.): the Hebbian store read with the identity score.

Each head has full query, key and value projections (d_k = the model width by
default, as in the paper) and the layer ends in the projection P. No softmax,
no 1/sqrt(d) scaling, no biases: only then can one layer be exactly one
gradient step (Chapter 11). The memory math is in tmem/memory/lsa.py.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp
import numpy as np
from flax import nnx

from tmem.memory.lsa import causal_read, gd_construction, prompt_read

LAYOUTS = ("auto", "prompt", "causal")


@dataclasses.dataclass(frozen=True)
class LSAConfig:
    name: str = "lsa"
    heads: int = 1
    head_dim: int | None = None  # d_k = d_v per head; None means the model width (the paper's square W_Q, W_K, W_V)
    # prompt: non-causal, every token reads the store written by all tokens but the last (the query);
    # causal: token t reads the writes of tokens s <= t (causal linear attention, identity features);
    # auto: the task's own layout (prompt for the von Oswald prompt, causal otherwise), set by validation
    layout: str = "auto"
    init_scale: float | None = 0.002  # fan-in variance scale, truncated normal (von Oswald: 0.002 / depth); None: Flax default
    lr: float = 1e-3  # the learning rate this row trains best at (used when optim.lr is null): von Oswald's

    applies_rope: ClassVar[bool] = False

    def check(self, width: int) -> None:
        if self.heads < 1:
            raise ValueError(f"mixer.heads={self.heads} must be positive")
        if self.head_dim is not None and self.head_dim < 1:
            raise ValueError(f"mixer.head_dim={self.head_dim} must be positive or null")
        if self.layout not in LAYOUTS:
            raise ValueError(f"mixer.layout={self.layout!r} is not one of: {', '.join(LAYOUTS)}")
        if self.init_scale is not None and self.init_scale <= 0:
            raise ValueError(f"mixer.init_scale={self.init_scale} must be positive or null")

    def state_size(self, width: int, seq_len: int) -> int:
        """One d_k x d_v store per head, whatever the length."""
        d = self.head_dim or width
        return self.heads * d * d

    def state_size_per_token(self, width: int) -> int | None:
        return None


class LinearSelfAttention(nnx.Module):
    """Multi-head LSA: e_t += sum_h P_h S_h^T W_Q,h e_t, with S_h = sum_s W_K,h e_s (W_V,h e_s)^T.

    The store S [B, H, d_k, d_v] (of the context tokens in the prompt layout)
    is sown as the `store` intermediate and returned as the final state; in the
    causal layout a call continues from an earlier call's store.
    """

    def __init__(self, cfg: LSAConfig, width: int, *, rope: bool, rngs: nnx.Rngs):
        if rope:
            raise ValueError("linear self-attention has no rotary positions")
        self.cfg, self.heads, self.d_head = cfg, cfg.heads, cfg.head_dim or width
        init = (nnx.initializers.variance_scaling(cfg.init_scale, "fan_in", "truncated_normal")
                if cfg.init_scale is not None else nnx.initializers.lecun_normal())
        inner = self.heads * self.d_head
        linear = lambda n_in, n_out: nnx.Linear(n_in, n_out, use_bias=False, kernel_init=init, rngs=rngs)  # noqa: E731
        self.query, self.key, self.value = linear(width, inner), linear(width, inner), linear(width, inner)
        self.out = linear(inner, width)  # the paper's P

    def __call__(self, x_btd, *, state=None, head_mask=None, read_at=None):
        """Read-out [B, T, D] (or [B, Q, D] at read_at [B, Q]) and the store."""
        B, T, _ = x_btd.shape
        H, d = self.heads, self.d_head
        k = self.key(x_btd).reshape(B, T, H, d)
        v = self.value(x_btd).reshape(B, T, H, d)
        x_q = x_btd if read_at is None else jnp.take_along_axis(x_btd, read_at[..., None], axis=1)
        q = self.query(x_q).reshape(B, -1, H, d)
        if self.cfg.layout == "prompt":  # (config validation has replaced auto by the task's layout)
            if state is not None:
                raise ValueError("mixer.layout=prompt reads one whole prompt; it cannot continue from a state")
            o_bthd, S = prompt_read(q, k, v, T - 1)
        else:
            o_bthd, S = causal_read(q, k, v, jnp.arange(T) if read_at is None else read_at, state)
        self.sow(nnx.Intermediate, "store", S, capture_noop=True)
        if head_mask is not None:
            o_bthd = o_bthd * head_mask[None, None, :, None].astype(o_bthd.dtype)
        return self.out(o_bthd.reshape(B, -1, H * d)), S


def construction_weights(cfg: LSAConfig, width: int, d: int, eta_over_n: float, gamma: float = 0.0,
                         w0=None) -> dict:
    """Proposition 1 as this module's parameters (head 0; other heads zero), for load_weights.

    Tokens are [x (d), y (width - d)]; w0 [width - d, d] is the starting point of GD.

    Flax computes x @ kernel, so each kernel is the transpose of the note's matrix.
    """
    d_head = cfg.head_dim or width
    if d_head < width:
        raise ValueError(f"the construction needs mixer.head_dim >= model.width={width}, not {d_head}")
    m = gd_construction(d, width - d, eta_over_n, w0=w0, gamma=gamma)
    inner = cfg.heads * d_head

    into_head = lambda M: np.pad(M.T, ((0, 0), (0, inner - width))).astype(np.float32)  # noqa: E731
    return {"query": {"kernel": into_head(m["W_Q"])}, "key": {"kernel": into_head(m["W_K"])},
            "value": {"kernel": into_head(m["W_V"])},
            "out": {"kernel": np.pad(m["P"].T, ((0, inner - width), (0, 0))).astype(np.float32)}}
