"""The rwkv7 row: RWKV-7's time mixing (Peng et al. 2025, "Goose"), the generalised delta rule.

Per head, with the note's value-major state (tmem.memory.rwkv7),

    S_t = S_{t-1} (Diag(w_t) - kh_t (a_t * kh_t)^T) + v_t kt_t^T,    o_t = S_t r_t,

around it, as RWKV-7's layer:

* token shift: each of the six maps (r, w, k, v, a, g) reads its own learned
  per-channel mix x_t + mu * (x_{t-1} - x_t) of the token and the one before;
* r, k, v plain linears; the decay w_t = exp(-e^{-1/2} sigmoid(w0 + W_w2 tanh(W_w1 x))),
  so log w_t is within (-0.61, 0); the in-context rate a_t = sigmoid(a0 + W_a2 W_a1 x);
* the removal key kh_t = the head's unit vector along k * k_k, and the
  replacement key kt_t = k_t * (1 + (a_t - 1) * k_a) (the issue's alpha is k_a);
* the read's per-head group norm, the bonus (r_t . (rho * kt_t)) v_t added after
  it, the gate g_t = W_g2 sigmoid(W_g1 x) and the output map.

Simplified from the reference: its LoRA maps are these low-rank linears of one
rank (`rank`), with the reference's inner activations; no value residual
across layers (v's mix with the first layer's), and the initialisation is
plain rather than layer-dependent (token-shift mixes 1/2; w0 spread over the
channels as the reference's first layer, -6.5 to -1.5; a0 = 0, k_k = 0.85,
k_a = 1, rho = 0; the low-rank maps' second matrices zero for w and a, so
decays and rates start at their biases). No RoPE: position comes from the
token shift and the decay.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import jax
import jax.numpy as jnp
from flax import nnx, struct

from tmem.layers import l2_normalize, linear
from tmem.memory import rwkv7
from tmem.mixers import flops as count
from tmem.mixers.base import Mixer, MixerConfig, MixerState, Run, at_positions, check_knobs, mask_heads, run_field

SHIFTED = ("r", "w", "k", "v", "a", "g")  # the maps that each read their own token-shift mix
LOG_DECAY_SCALE = -math.exp(-0.5)  # log w = -e^{-1/2} sigmoid(.): decays in (0.545, 1)
GROUP_NORM_EPS = 1e-5  # times the head's width, as fla's RWKV-7


@dataclasses.dataclass(frozen=True)
class RWKV7Run(Run):
    form: str = "chunked"  # chunked (training) | recurrent (the definition, a token at a time)
    chunk: int = 64  # tokens per chunk of the chunked form


@dataclasses.dataclass(frozen=True)
class RWKV7Config(MixerConfig):
    name: str = "rwkv7"
    heads: int = 4
    rank: int = 16  # of the low-rank maps for the decay, the in-context rate and the gate
    run: RWKV7Run = run_field(RWKV7Run)

    def check(self, width: int) -> None:
        check_knobs(self, choices={"run.form": tuple(rwkv7.FORMS)}, positive=("rank", "run.chunk"), width=width)

    def state_size(self, width: int, seq_len: int) -> int:
        """The d_k x d_v matrix of each head and the token shift's last token."""
        d = width // self.heads
        return self.heads * d * d + width

    def flops(self, model, B: int, T: int, Q: int | None, input_grad: bool, once: bool = False) -> Counter:
        """tmem.mixers.rwkv7: the token shift's six mixes, r, k and v, the low-rank maps of the decay, the rate and
        the gate, the removal and replacement keys, the memory (the chunked form), and at the read positions the
        group norm, the bonus, the gate and the output map (the reads gathered there, their gradients scattered
        back)."""
        c, D = self, model.width
        count.training_form(c, "chunked")
        H, N, R, r = c.heads, B * T, B * (Q or T), c.rank
        grads = 2 if input_grad else 1
        mixes = len(SHIFTED)
        parts = Counter()
        parts["mixer/projections"] += 3 * count.matmul(N, D, D, grads) + 2 * (count.matmul(N, D, r, grads) + count.matmul(N, r, D))
        parts["mixer/projections"] += count.matmul(R, D, r, grads) + count.matmul(R, r, D) + count.matmul(R, D, D)  # the gate, out
        # the shift x_{t-1} - x_t; the mixes x + mu (shift) and their gradients (mu's summed over the tokens, the
        # shift's and x's summed over the mixes)
        gates = 2 * N * D + mixes * N * D * 2 + mixes * N * D * 2 + (2 * mixes - 1) * N * D + (mixes - 1) * N * D
        gates += 2 * N * D + count.elementwise(N * D, count.SIGMOID) + 2 * N * D + 3 * N * r  # log w: w0 +, sigmoid, scale; tanh
        gates += 2 * N * D + count.elementwise(N * D, count.SIGMOID)  # a: a0 +, sigmoid
        gates += count.elementwise(N * D, count.PRODUCT) + N * D + count.elementwise(N * D, count.L2_NORMALIZE)  # kh = unit(k * k_k)
        gates += 10 * N * D  # kt = k * (1 + (a - 1) * k_a) and its gradients
        gates += 12 * R * D + R * D  # the bonus (r . (rho * kt)) v and its add
        gates += count.elementwise(R * r, count.SIGMOID) + count.elementwise(R * D, count.PRODUCT)  # the gate's sigmoid, o * g
        gates += 5 * R * D if Q else 0  # r, kt, v, o and the gate's mix read at Q: their gradients scattered back
        parts["mixer/gates"] += gates
        parts["norms"] += count.norm("layernorm", R * D)
        parts["mixer/memory"] += count.rwkv7_chunked(B * H, T, D // H, c.run.chunk, once)
        return parts


@struct.dataclass
class RWKV7State(MixerState):
    """The memory [B, H, d_k, d_v] (key-major: the note's S transposed) and the last token's input [B, 1, D]."""

    memory: jax.Array
    last: jax.Array

    def matrix(self, layer: RWKV7) -> jax.Array:
        """The memory itself: key-major, read r S."""
        return self.memory


class RWKV7(Mixer):
    """RWKV-7's time mixing; the final memory is sown as the `state` intermediate, the removal keys as `keys`."""

    sows = frozenset({"state", "keys"})

    def __init__(self, cfg: RWKV7Config, width: int, *, rope: bool, rngs: nnx.Rngs):
        del rope
        self.cfg = cfg
        H, R = cfg.heads, cfg.rank
        self.d_head = width // H
        layer = lambda n_in, n_out: linear(n_in, n_out, bias=False, rngs=rngs)  # noqa: E731
        self.mix = nnx.Param(jnp.full((len(SHIFTED), width), 0.5))
        self.r, self.k, self.v = layer(width, width), layer(width, width), layer(width, width)
        self.w_down, self.w_up = layer(width, R), layer(R, width)
        self.a_down, self.a_up = layer(width, R), layer(R, width)
        self.g_down, self.g_up = layer(width, R), layer(R, width)
        self.w_up.kernel[...] = jnp.zeros((R, width))
        self.a_up.kernel[...] = jnp.zeros((R, width))
        self.w0 = nnx.Param(-6.5 + 5.0 * jnp.linspace(0.0, 1.0, width) ** 0.85)
        self.a0 = nnx.Param(jnp.zeros((width,)))
        self.k_k = nnx.Param(jnp.full((width,), 0.85))
        self.k_a = nnx.Param(jnp.ones((width,)))
        self.rho = nnx.Param(jnp.zeros((H, self.d_head)))
        self.norm_scale, self.norm_bias = nnx.Param(jnp.ones((H, self.d_head))), nnx.Param(jnp.zeros((H, self.d_head)))
        self.out = layer(width, width)

    def group_norm(self, o):
        """Each head's read [B, T, H, d_v] normalised alone, with a scale and bias per channel."""
        mean = jnp.mean(o, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(o - mean), axis=-1, keepdims=True)
        o = (o - mean) * jax.lax.rsqrt(var + GROUP_NORM_EPS * self.d_head)
        return o * self.norm_scale[...][None, None] + self.norm_bias[...][None, None]

    def __call__(self, x_btd, *, state: RWKV7State | None = None, head_mask=None, read_at=None,
                 qk_positions=None):
        """The protocol's call (tmem.mixers.base.Mixer)."""
        del qk_positions  # validation gives it only to rows that take it
        cfg, (B, T, D), H = self.cfg, x_btd.shape, self.cfg.heads
        last = jnp.zeros((B, 1, D), x_btd.dtype) if state is None else state.last.astype(x_btd.dtype)
        shifted = jnp.concatenate([last, x_btd[:, :-1]], axis=1) - x_btd  # x_{t-1} - x_t
        xs = dict(zip(SHIFTED, (x_btd[None] + self.mix[...][:, None, None] * shifted[None])))
        heads = lambda y: y.reshape(*y.shape[:2], H, self.d_head)  # noqa: E731
        r, k, v = heads(self.r(xs["r"])), heads(self.k(xs["k"])), heads(self.v(xs["v"]))
        log_w = heads(LOG_DECAY_SCALE * jax.nn.sigmoid(self.w0[...][None, None]
                                                        + self.w_up(jnp.tanh(self.w_down(xs["w"])))))
        a = heads(jax.nn.sigmoid(self.a0[...][None, None] + self.a_up(self.a_down(xs["a"]))))
        kh = l2_normalize(k * heads(self.k_k[...][None, None]))
        kt = k * (1 + (a - 1) * heads(self.k_a[...][None, None]))
        self.sow(nnx.Intermediate, "keys", kh, capture_noop=True)
        form = rwkv7.FORMS[cfg.run.form]
        kwargs = {"chunk": cfg.run.chunk} if cfg.run.form == "chunked" else {}
        o, memory = form(r, log_w, kh, a, kt, v, state=None if state is None else state.memory, **kwargs)
        self.sow(nnx.Intermediate, "state", memory, capture_noop=True)
        r, kt, v, o = (at_positions(y, read_at) for y in (r, kt, v, o))
        bonus = jnp.sum(r * self.rho[...][None, None] * kt, axis=-1, keepdims=True) * v
        o = mask_heads(self.group_norm(o) + bonus, head_mask).reshape(B, -1, D)
        o = o * self.g_up(jax.nn.sigmoid(self.g_down(at_positions(xs["g"], read_at))))
        length = T + (0 if state is None else state.length)
        return self.out(o), RWKV7State(memory, x_btd[:, -1:], length=length)
