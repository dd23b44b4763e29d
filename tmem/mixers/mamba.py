"""The mamba row: Mamba-1's selective state-space layer (Gu and Dao 2023).

The layer, as the reference block: an in-projection to x and z (each
`expand` x width wide, d channels), a short causal convolution with a bias and
SiLU on x, from x the step dt = softplus(W_dt (W_low x) + dt_bias) (d wide,
through a rank-`dt_rank` bottleneck) and the token's B and C (N each), the
selective memory (tmem.memory.selective)

    S_t = exp(dt_t 1^T * A) * S_{t-1} + (dt_t * x_t) B_t^T,    y_t = S_t C_t + D * x_t,

A = -exp(A_log) [d, N], and the output y * silu(z) through the out-projection.
Initialisation as the reference: A_log = log(1..N) in every channel (S4D-real),
dt_bias = softplus^-1(dt) with dt ~ logU(1e-3, 1e-1) floored at 1e-4, W_dt
uniform within +-dt_rank^-1/2, D = 1 (MambaConfig's defaults; the row's YAML draws A and dt
wider, `mixer.a_range` and `mixer.dt_range`, since at these two seeds of three never learned the default
job). Mamba-2 (mixer=mamba2, a fast-weight
row) is the same memory with the decay made one scalar per head, which turns
it into masked matmuls (docs/rows.md). It has no heads: head_mask, if given,
has one entry that scales the whole read.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
import math

import jax
import jax.numpy as jnp
from flax import nnx, struct

from tmem.layers import ShortConv, linear, short_conv
from tmem.memory import selective
from tmem.mixers import flops as count
from tmem.mixers.base import Mixer, MixerConfig, MixerState, Run, at_positions, check_knobs, mask_heads, run_field
from tmem.mixers.fast_weight import DT_RANGE, _inverse_softplus  # Mamba-2's dt initialisation is Mamba-1's

DT_FLOOR = 1e-4  # the reference's dt_init_floor


@dataclasses.dataclass(frozen=True)
class MambaRun(Run):
    # scan (the definition, a token at a time) | parallel (an associative scan over the tokens: the same function,
    # every state at once). On the 2-core CPU the scan trains faster: one layer's forward and backward at the
    # default job's shapes (32 examples, d = 128, N = 16) took 0.40 s against 1.25 s, the machine shared
    form: str = "scan"


@dataclasses.dataclass(frozen=True)
class MambaConfig(MixerConfig):
    name: str = "mamba"
    expand: int = 2  # d = expand x width channels in x and z
    d_state: int = 16  # N states per channel
    dt_rank: int | None = None  # the step's bottleneck; None: ceil(width / 16), the reference's "auto"
    short_conv: int = 4  # kernel of the causal convolution on x (with a bias, then SiLU); 0 for none
    run: MambaRun = run_field(MambaRun)
    # -A's initialisation: None, S4D-real (A_n = n for state n, in every channel: the reference); [low, high], each
    # (channel, state) entry drawn from U(low, high), as Mamba-2's row draws its per-head A (mixer.a_range there)
    a_range: tuple[float, float] | None = None
    # the initial steps dt ~ logU(low, high) of each channel (the reference's dt_min, dt_max), through dt's bias
    dt_range: tuple[float, float] = DT_RANGE

    def check(self, width: int) -> None:
        check_knobs(self, choices={"run.form": tuple(selective.FORMS)}, positive=("expand", "d_state", "dt_rank"))
        if self.a_range is not None and (len(self.a_range) != 2 or not 0 < self.a_range[0] <= self.a_range[1]):
            raise ValueError(f"mixer.a_range={list(self.a_range)} must be [low, high] with 0 < low <= high, or null")
        if len(self.dt_range) != 2 or not 0 < self.dt_range[0] <= self.dt_range[1]:
            raise ValueError(f"mixer.dt_range={list(self.dt_range)} must be [low, high] with 0 < low <= high")

    def rank(self, width: int) -> int:
        return self.dt_rank or math.ceil(width / 16)

    def state_size(self, width: int, seq_len: int) -> int:
        """S (d x N) and the convolution's window of d channels."""
        d = self.expand * width
        return d * self.d_state + max(self.short_conv - 1, 0) * d

    def flops(self, model, B: int, T: int, Q: int | None, input_grad: bool, once: bool = False) -> Counter:
        """tmem.mixers.mamba in its training form, the token scan: the in-projection, the convolution with its bias
        and SiLU, the maps to dt's bottleneck, B and C and from it to dt (with a bias) and softplus, A = -exp(A_log),
        the scan, and at the read positions the skip D x, the gate silu(z) and the output map. The associative scan
        (form=parallel) has no count: XLA's CPU count of it grows as T log T, its fusions recomputing the rounds."""
        c, D = self, model.width
        count.training_form(c, "scan")
        d, Ns, R_dt = c.expand * D, c.d_state, c.rank(D)
        N, R = B * T, B * (Q or T)
        parts = Counter()
        parts["mixer/projections"] += (count.matmul(N, D, 2 * d, 2 if input_grad else 1) + count.matmul(N, d, R_dt + 2 * Ns)
                                       + count.matmul(N, R_dt, d) + 2 * N * d + count.matmul(R, d, D))
        gates = count.elementwise(N * d, count.SOFTPLUS) + 3 * d * Ns  # dt's softplus; A = -exp(A_log) and its gradient
        if c.short_conv:
            parts["mixer/conv"] += count.short_conv(B, T, d, c.short_conv) + 2 * N * d
        else:  # x's SiLU alone
            gates += count.elementwise(N * d, count.SILU)
        gates += 5 * R * d + count.elementwise(R * d, count.SILU) + count.elementwise(R * d, count.PRODUCT)  # + D x; * silu(z)
        gates += 2 * R * d if Q else 0  # x and z read at Q: their gradients scattered back
        parts["mixer/gates"] += gates
        parts["mixer/memory"] += count.selective_scan(B, T, d, Ns, None if Q is None else B * Q, once)
        return parts


@struct.dataclass
class MambaState(MixerState):
    """The selective state S [B, d, N] and the convolution's last inputs [B, K-1, d]."""

    memory: jax.Array
    conv: jax.Array | None

    def matrix(self, layer: Mamba) -> jax.Array:
        """S [B, d, N] read S C: one head whose keys are B (N wide) and values d wide, as [B, 1, N, d]."""
        return jnp.swapaxes(self.memory, -1, -2)[:, None]


class Mamba(Mixer):
    """Mamba-1's block; the final state is sown as the `state` intermediate."""

    sows = frozenset({"state"})

    heads = 1  # for head_mask: the whole read is one head

    def __init__(self, cfg: MambaConfig, width: int, *, rope: bool, rngs: nnx.Rngs):
        del rope  # positions come from the convolution and the decay
        self.cfg = cfg
        d, N, R = cfg.expand * width, cfg.d_state, cfg.rank(width)
        self.d_inner = d
        self.in_proj = linear(width, 2 * d, bias=False, rngs=rngs)
        if cfg.short_conv:
            self.conv = ShortConv(d, cfg.short_conv, bias=True, rngs=rngs)
        self.x_proj = linear(d, R + 2 * N, bias=False, rngs=rngs)
        self.dt_proj = linear(R, d, bias=True, rngs=rngs)
        self.dt_proj.kernel[...] = jax.random.uniform(rngs.params(), (R, d), minval=-R ** -0.5, maxval=R ** -0.5)
        dt = jnp.exp(jax.random.uniform(rngs.params(), (d,), minval=math.log(cfg.dt_range[0]),
                                        maxval=math.log(cfg.dt_range[1])))
        self.dt_proj.bias[...] = _inverse_softplus(jnp.maximum(dt, DT_FLOOR))
        if cfg.a_range is None:
            self.A_log = nnx.Param(jnp.broadcast_to(jnp.log(jnp.arange(1, N + 1, dtype=jnp.float32)), (d, N)))
        else:
            self.A_log = nnx.Param(jnp.log(jax.random.uniform(rngs.params(), (d, N), minval=cfg.a_range[0],
                                                              maxval=cfg.a_range[1])))
        self.D = nnx.Param(jnp.ones((d,)))
        self.out = linear(d, width, bias=False, rngs=rngs)

    def __call__(self, x_btd, *, state: MambaState | None = None, head_mask=None, read_at=None,
                 qk_positions=None):
        """The protocol's call (tmem.mixers.base.Mixer)."""
        del qk_positions  # validation gives it only to rows that take it
        cfg, (_, T, _) = self.cfg, x_btd.shape
        N = cfg.d_state
        x, z = jnp.split(self.in_proj(x_btd), 2, axis=-1)
        tail = None
        if cfg.short_conv:
            x, tail = short_conv(x, self.conv.kernel[...], None if state is None else state.conv,
                                 self.conv.bias[...], silu=True)
        else:
            x = jax.nn.silu(x)
        low, Bm, Cm = jnp.split(self.x_proj(x), [self.x_proj.kernel.shape[1] - 2 * N,
                                                  self.x_proj.kernel.shape[1] - N], axis=-1)
        dt = jax.nn.softplus(self.dt_proj(low))
        A = -jnp.exp(self.A_log[...])
        y, memory = selective.FORMS[cfg.run.form](x, dt, A, Bm, Cm, state=None if state is None else state.memory,
                                              read_at=read_at)
        self.sow(nnx.Intermediate, "state", memory, capture_noop=True)
        y = (y + self.D[...][None, None] * at_positions(x, read_at)) * jax.nn.silu(at_positions(z, read_at))
        y = mask_heads(y[:, :, None], head_mask)[:, :, 0]
        length = T + (0 if state is None else state.length)
        return self.out(y), MambaState(memory, tail, length=length)
