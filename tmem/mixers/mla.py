"""The mla row: multi-head latent attention (DeepSeek-V2), softmax attention whose cache is a low-rank latent.

Each token writes one latent c_t = W_DKV x_t (`latent` wide, RMS-normed) and
one rotary key k^R_t = RoPE(W_KR x_t) (`rope_dim` wide) that every head
shares; that pair is the whole cache. Head h reads

    q_t = [q^C_t,h ; RoPE(q^R_t,h)],   k_s = [W_UK,h c_s ; k^R_s],   v_s = W_UV,h c_s,
    o_t,h = sum_s softmax_s(beta q_t . k_s) v_s,

with the queries from x directly or through their own latent
(`q_latent`: W_UQ RMSNorm(W_DQ x)). RoPE cannot be folded into W_UK (the
rotation sits between the query and the key and depends on both positions),
hence the separate rotary key. Where the other softmax rows cache
2 x heads x d_head numbers a token, this one caches latent + rope_dim.

Two forms of the same function (`run.form`): naive, which up-projects every cached
latent to its heads' keys and values, and absorbed, which folds W_UK into the
query (q^C W_UK,h^T, a latent-wide query per head) and W_UV after the read,
so the heads read the latent cache directly: multi-query attention over the
latent. Naive costs less over a whole sequence, absorbed per decoded token.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import nnx, struct

from tmem.layers import linear, rope
from tmem.memory import softmax_read
from tmem.mixers import flops as count
from tmem.mixers.attention import readable
from tmem.mixers.base import (Mixer, MixerConfig, MixerState, NoMatrix, at_positions, check_knobs,
                              Run, check_temperature, mask_heads, run_field)

FORMS = ("naive", "absorbed")


@dataclasses.dataclass(frozen=True)
class MLARun(Run):
    form: str = "naive"  # naive | absorbed (module docstring): the same function


@dataclasses.dataclass(frozen=True)
class MLAConfig(MixerConfig):
    name: str = "mla"
    heads: int = 4  # each of width / heads for its non-rotated query and key and for its value
    latent: int = 32  # d_c, the cached latent of keys and values
    q_latent: int | None = None  # d_c', the queries' own latent; None: queries straight from x
    # d_R: each head's rotary query, and the one rotary key all heads share (even). As wide as a head here: at 8
    # (DeepSeek-V2's d_R = d_head / 2) the default job sat at 0.25 for 1,700 steps (seed 0); at 16, 0.99 at 400
    rope_dim: int = 16
    latent_norm: bool = True  # RMSNorm on each latent, as DeepSeek-V2 (off: c = W_DKV x, a plain factorisation)
    temperature: float | None = None  # beta; None: 1/sqrt(width / heads + rope_dim), the query's width
    rope_base: float = 10_000.0
    run: MLARun = run_field(MLARun)

    applies_rope: ClassVar[bool] = True
    needs_rope: ClassVar[bool] = True
    attention_patterns: ClassVar[bool] = True

    def check(self, width: int) -> None:
        check_knobs(self, choices={"run.form": FORMS}, positive=("latent", "q_latent", "rope_dim"), width=width)
        check_temperature(self.temperature)
        if self.rope_dim % 2:
            raise ValueError(f"mixer.rope_dim={self.rope_dim} must be even: RoPE turns pairs of coordinates")

    def beta(self, width: int) -> float:
        return self.temperature if self.temperature is not None else (width // self.heads + self.rope_dim) ** -0.5

    def state_size(self, width: int, seq_len: int) -> int:
        """The latent and the rotary key of every token read."""
        return self.state_size_per_token(width) * seq_len

    def state_size_per_token(self, width: int) -> int:
        return self.latent + self.rope_dim

    def flops(self, model, B: int, T: int, Q: int | None, input_grad: bool, once: bool = False) -> Counter:
        """The naive form: x's maps to the latent and rotary key (every token) and to the queries (read
        positions), the latents' norms, the up-projection of every latent to the heads' keys and values, RoPE on
        the rotary parts, softmax(beta q k^T) v over T keys of width d + d_R, and the output map."""
        c, D = self, model.width
        count.training_form(c, "naive")
        H, d, L, dr = c.heads, D // c.heads, c.latent, c.rope_dim
        N, R = B * T, B * (Q or T)
        grads = 2 if input_grad else 1
        parts = Counter()
        parts["mixer/projections"] += count.matmul(N, D, L + dr, grads) + count.matmul(N, L, 2 * D)
        if c.q_latent:
            parts["mixer/projections"] += (count.matmul(R, D, c.q_latent, grads)
                                           + count.matmul(R, c.q_latent, H * (d + dr)))
        else:
            parts["mixer/projections"] += count.matmul(R, D, H * (d + dr), grads)
        parts["mixer/projections"] += count.matmul(R, D, D)
        if c.latent_norm:
            parts["norms"] += count.norm("rmsnorm", N * L + (R * c.q_latent if c.q_latent else 0))
        parts["mixer/memory"] += 6 * (N * dr + R * H * dr)  # RoPE of the rotary key and queries, and back
        parts["mixer/memory"] += 2 * (R * H * (d + dr) + N * H * (d + dr))  # q and k assembled, their gradients split
        scores = R * H * T
        parts["mixer/memory"] += (count.matmul(R * H, d + dr, T) + count.matmul(R * H, T, d)
                                  + count.elementwise(scores, count.SOFTMAX) + 4 * scores + (R * T if Q else 0))
        return parts


@struct.dataclass
class LatentCache(MixerState):
    """MLA's store: each token's latent [B, S, latent] and rotated shared key [B, S, rope_dim]."""

    latent: jax.Array
    rope_keys: jax.Array

    def matrix(self, layer: MLA) -> jax.Array:
        raise NoMatrix("a latent cache, one latent and rotary key per token")


class MLA(Mixer):
    """Causal multi-head latent attention (module docstring). The per-head weights are sown as `attention`."""

    sows = frozenset({"attention"})

    def __init__(self, cfg: MLAConfig, width: int, *, rope: bool, rngs: nnx.Rngs):
        # `rope` is always true here: validation refuses any other positions for a row that needs_rope
        self.cfg = cfg
        self.heads, self.d_head = cfg.heads, width // cfg.heads
        q_width = cfg.heads * (self.d_head + cfg.rope_dim)  # each head's non-rotated part, then the rotary parts
        self.kv_down = linear(width, cfg.latent + cfg.rope_dim, bias=False, rngs=rngs)  # W_DKV beside W_KR
        self.kv_up = linear(cfg.latent, 2 * width, bias=False, rngs=rngs)  # W_UK beside W_UV
        if cfg.q_latent:
            self.q_down = linear(width, cfg.q_latent, bias=False, rngs=rngs)
            self.q_up = linear(cfg.q_latent, q_width, bias=False, rngs=rngs)
        else:
            self.q_proj = linear(width, q_width, bias=False, rngs=rngs)
        self.out = linear(width, width, bias=False, rngs=rngs)
        if cfg.latent_norm:
            self.kv_norm = nnx.RMSNorm(cfg.latent, rngs=rngs)
            if cfg.q_latent:
                self.q_norm = nnx.RMSNorm(cfg.q_latent, rngs=rngs)

    def queries(self, x_btd):
        """Each head's non-rotated query [B, T, H, d] and rotary query [B, T, H, d_R] (not yet rotated)."""
        cfg, (B, T, _) = self.cfg, x_btd.shape
        if cfg.q_latent:
            c_q = self.q_down(x_btd)
            q = self.q_up(self.q_norm(c_q) if cfg.latent_norm else c_q)
        else:
            q = self.q_proj(x_btd)
        H, d = self.heads, self.d_head
        return q[..., :H * d].reshape(B, T, H, d), q[..., H * d:].reshape(B, T, H, cfg.rope_dim)

    def circuit_weights(self) -> tuple[jax.Array, int]:
        """The effective W_Q, W_K, W_V [D, 3D] of the non-rotated parts, as SoftmaxAttention.circuit_weights gives
        its own: W_DQ W_UQ (or W_Q), W_DKV diag(g) W_UK and W_DKV diag(g) W_UV with g the latent norms' gains (the
        norms' division, and the rotary parts, which carry positions, left out as the probes leave out norms and
        RoPE). One key-value head per query head."""
        cfg, H, d = self.cfg, self.heads, self.d_head
        if cfg.q_latent:
            gain = self.q_norm.scale[...] if cfg.latent_norm else 1.0
            w_q = (self.q_down.kernel[...] * gain) @ self.q_up.kernel[:, :H * d]
        else:
            w_q = self.q_proj.kernel[:, :H * d]
        gain = self.kv_norm.scale[...] if cfg.latent_norm else 1.0
        return jnp.concatenate([w_q, (self.kv_down.kernel[:, :cfg.latent] * gain) @ self.kv_up.kernel[...]], 1), H

    def __call__(self, x_btd, *, state: LatentCache | None = None, head_mask=None, read_at=None, qk_positions=None):
        cfg, (B, T, D) = self.cfg, x_btd.shape
        H, d, L = self.heads, self.d_head, cfg.latent
        offset = 0 if state is None else state.length
        down = self.kv_down(x_btd)
        c = self.kv_norm(down[..., :L]) if cfg.latent_norm else down[..., :L]
        k_rope = rope(down[..., None, L:], offset + jnp.arange(T), cfg.rope_base)[:, :, 0]
        if state is not None:
            c = jnp.concatenate([state.latent, c], axis=1)
            k_rope = jnp.concatenate([state.rope_keys, k_rope], axis=1)
        q_pos = offset + (jnp.arange(T) if read_at is None else read_at)
        q_c, q_r = self.queries(at_positions(x_btd, read_at))
        q_r = rope(q_r, q_pos, cfg.rope_base)
        mask = readable(q_pos, offset + T, c.shape[1])
        w_uk, w_uv = self.kv_up.kernel[:, :D].reshape(L, H, d), self.kv_up.kernel[:, D:].reshape(L, H, d)
        read = absorbed if cfg.run.form == "absorbed" else naive
        o_bthd, weights = read(q_c, q_r, c, k_rope, w_uk, w_uv, mask, cfg.beta(D))
        self.sow(nnx.Intermediate, "attention", weights, capture_noop=True)
        o_bthd = mask_heads(o_bthd, head_mask)
        return self.out(o_bthd.reshape(B, -1, D)), LatentCache(c, k_rope, length=offset + T)


def naive(q_c, q_r, c, k_rope, w_uk, w_uv, mask, beta):
    """Every cached latent up-projected to each head's key and value, the rotary key beside each head's key:
    softmax attention with keys of width d + d_R. Returns the read [B, T, H, d] and the weights [B, H, T, S]."""
    k = jnp.einsum("bsl,lhd->bshd", c, w_uk)
    k = jnp.concatenate([k, jnp.broadcast_to(k_rope[:, :, None], k.shape[:3] + k_rope.shape[-1:])], axis=-1)
    v = jnp.einsum("bsl,lhd->bshd", c, w_uv)
    return softmax_read(jnp.concatenate([q_c, q_r], axis=-1), k, v, mask, beta)


def absorbed(q_c, q_r, c, k_rope, w_uk, w_uv, mask, beta):
    """W_UK folded into the query and W_UV applied after the read: every head reads the one latent cache
    (one key-value head, as multi-query attention), q^C . W_UK c = (W_UK^T q^C) . c. The same as `naive`."""
    q = jnp.concatenate([jnp.einsum("bthd,lhd->bthl", q_c, w_uk), q_r], axis=-1)
    k = jnp.concatenate([c, k_rope], axis=-1)[:, :, None]
    o_latent, weights = softmax_read(q, k, c[:, :, None], mask, beta)
    return jnp.einsum("bthl,lhd->bthd", o_latent, w_uv), weights
