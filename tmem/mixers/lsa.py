"""Linear self-attention (von Oswald et al.): the Hebbian store read with the identity score.

Each head has full query, key and value projections (d_k = the model width by
default, as in the paper) and the layer ends in the projection P. No softmax,
no 1/sqrt(d) scaling, no biases: only then can one layer be exactly one
gradient step (Chapter 11). The memory math is in tmem/memory/lsa.py.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from tmem.memory.lsa import causal_read, gd_construction, prompt_read
from tmem.mixers import flops as count
from tmem.mixers.base import Mixer, MixerConfig, MixerState, Recipe, at_positions, mask_heads, recommended

LAYOUTS = ("auto", "prompt", "causal")


@dataclasses.dataclass(frozen=True)
class LSAConfig(MixerConfig):
    name: str = "lsa"
    heads: int = 1
    head_dim: int | None = None  # d_k = d_v per head; None means the model width (the paper's square W_Q, W_K, W_V)
    # prompt: non-causal, every token reads the store written by all tokens but the last (the query);
    # causal: token t reads the writes of tokens s <= t (causal linear attention, identity features);
    # auto: the task's own layout (prompt for the von Oswald prompt, causal otherwise), set by validation
    layout: str = "auto"
    init_scale: float | None = 0.002  # fan-in variance scale, truncated normal (von Oswald: 0.002 / depth); None: Flax default
    recipe: Recipe = recommended(lr=1e-3)  # von Oswald's

    def check(self, width: int) -> None:
        if self.heads < 1:
            raise ValueError(f"mixer.heads={self.heads} must be positive")
        if self.head_dim is not None and self.head_dim < 1:
            raise ValueError(f"mixer.head_dim={self.head_dim} must be positive or null")
        if self.layout not in LAYOUTS:
            raise ValueError(f"mixer.layout={self.layout!r} is not one of: {', '.join(LAYOUTS)}")
        if self.init_scale is not None and self.init_scale <= 0:
            raise ValueError(f"mixer.init_scale={self.init_scale} must be positive or null")

    def fit(self, task, width: int) -> LSAConfig:
        """Read the way the task's prompt allows: auto becomes its layout; a prompt read needs a prompt."""
        if self.layout == "auto":
            return dataclasses.replace(self, layout=task.layout)
        if self.layout == "prompt" and task.layout != "prompt":
            raise ValueError(f"mixer.layout=prompt reads the whole prompt at once, but task {task.name!r} is "
                             "read causally; use mixer.layout=causal or auto")
        return self

    def state_size(self, width: int, seq_len: int) -> int:
        """One d_k x d_v store per head, whatever the length."""
        d = self.head_dim or width
        return self.heads * d * d

    def flops(self, model, B: int, T: int, Q: int | None, input_grad: bool, once: bool = False) -> Counter:
        """The prompt layout writes T - 1 tokens into a store read by every query; the causal
        layout reads the masked scores (its store is the final state, which training never reads)."""
        c, D = self, model.width
        H, d = c.heads, c.head_dim or D
        R = B * (Q or T)
        grads = 2 if input_grad else 1
        parts = Counter()
        parts["mixer/projections"] += (2 * count.matmul(B * T, D, H * d, grads) + count.matmul(R, D, H * d, grads)
                                       + count.matmul(R, H * d, D))
        if c.layout == "prompt":
            parts["mixer/memory"] += count.matmul(B * H * d, T - 1, d) + count.matmul(R * H, d, d)
        else:
            parts["mixer/memory"] += (count.matmul(R * H, d, T) + count.matmul(R * H, T, d) + 2 * R * H * T
                                      + (R * T if Q else 0))
        return parts


@struct.dataclass
class Store(MixerState):
    """The Hebbian store S [B, H, d_k, d_v] of the tokens that wrote."""

    store: jax.Array

    def matrix(self, layer: LinearSelfAttention) -> jax.Array:
        return self.store


class LinearSelfAttention(Mixer):
    """Multi-head LSA: e_t += sum_h P_h S_h^T W_Q,h e_t, with S_h = sum_s W_K,h e_s (W_V,h e_s)^T.

    The store S [B, H, d_k, d_v] (of the context tokens in the prompt layout)
    is sown as the `store` intermediate and returned as the final state; in the
    causal layout a call continues from an earlier call's store.
    """

    sows = frozenset({"store", "keys"})

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

    def __call__(self, x_btd, *, state: Store | None = None, head_mask=None, read_at=None, qk_positions=None):
        """The protocol's call (tmem.mixers.base.Mixer); the prompt layout reads one whole prompt."""
        del qk_positions  # no positions: validation rejects shortformer for this row
        B, T, _ = x_btd.shape
        H, d = self.heads, self.d_head
        k = self.key(x_btd).reshape(B, T, H, d)
        self.sow(nnx.Intermediate, "keys", k, capture_noop=True)  # the keys written into the store
        v = self.value(x_btd).reshape(B, T, H, d)
        q = self.query(at_positions(x_btd, read_at)).reshape(B, -1, H, d)
        if self.cfg.layout == "prompt":  # (config validation has replaced auto by the task's layout)
            if state is not None:
                raise ValueError("mixer.layout=prompt reads one whole prompt; it cannot continue from a state")
            o_bthd, S = prompt_read(q, k, v, T - 1)
        else:
            o_bthd, S = causal_read(q, k, v, jnp.arange(T) if read_at is None else read_at,
                                    None if state is None else state.store)
        self.sow(nnx.Intermediate, "store", S, capture_noop=True)
        o_bthd = mask_heads(o_bthd, head_mask)
        return self.out(o_bthd.reshape(B, -1, H * d)), Store(S, length=T + (0 if state is None else state.length))


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
