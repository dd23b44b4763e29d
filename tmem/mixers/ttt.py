"""The ttt_linear and ttt_mlp rows: test-time training by mini-batch gradient steps (Sun et al. 2024).

The memory is the inner model f(x) = x + LN(g(x)) per head, g linear
(x W + b; tmem/memory/ttt.py, with its hand-written dual form) or an MLP
(GELU(x W1 + b1) W2 + b2, hidden 4d; tmem/memory/gradient.py), trained inside
the forward pass on the loss 1/2 ||LN(g(k)) - (v - k)||^2 with a mini-batch of
`mini_batch` tokens per step and a learned per-token rate. The layer follows
the official JAX code (test-time-training/ttt-lm-jax, TTTLinear and TTTMLP;
anchors/mixers.md 4.1):

* q and k share one projection, each with its own causal depthwise
  convolution (kernel 4, with a bias, no activation); v its own projection;
  no q scale;
* RoPE on q and k at the position within the mini-batch (official: position
  modulo the mini-batch size; here tmem's rotate-half pairing, a fixed
  permutation of the official's adjacent pairs);
* the rate lr_j = base_lr sigmoid(w_h . x_j + c_h) / d per head, and the
  reading position's factor max(0, 1/(i+1) + offset_i), offsets learned from 0;
* the initial weights W_0 ~ N(0, 0.02) (each of the MLP's), b_0 = 0 and the inner LayerNorm's
  scale and bias (per head, from 1 and 0) are slow weights, learned by the
  outer loop and never changed by the inner one;
* the read is LayerNormed over the width, gated by GELU(W_g x) (tanh form),
  and mapped out.

Where fla's TTT differs (one rate per reading position, eta_ij = eta_i, the
mini-batch closing with the last token's; q scaled by d^-1/2), this follows
the original. The projections use tmem's default initialisation (the
official draws them from N(0, 0.02)).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import jax
import jax.numpy as jnp
from flax import nnx, struct

from tmem.layers import ShortConv, rope
from tmem.memory import gradient, ttt
from tmem.mixers import flops as count
from tmem.mixers.base import (Cell, Mixer, MixerConfig, MixerState, NoMatrix, Recipe, Run, at_positions, check_knobs,
                              mask_heads, recommended, run_field)

FORMS = ("dual", "recurrent")
INNERS = ("linear", "mlp")
INIT_STD = 0.02  # the official initializer_range, for W_0 and the rate's weights


@dataclasses.dataclass(frozen=True)
class TTTRun(Run):
    form: str = "dual"  # dual (training: masked matmuls within a mini-batch) | recurrent (the definition)


@dataclasses.dataclass(frozen=True)
class TTTConfig(MixerConfig):
    name: str = "ttt_linear"
    recipe: Recipe = recommended(lr=1e-2)
    heads: int = 4
    inner: str = "linear"  # the inner model g: linear (TTT-Linear) | mlp (TTT-MLP: GELU, hidden expansion x d)
    expansion: int = 4
    mini_batch: int = 16  # b: tokens whose gradients are taken at the same starting weights (official: 16)
    base_lr: float = 1.0  # the inner rate's scale (official: 1.0 for TTT-Linear, 0.1 for TTT-MLP)
    run: TTTRun = run_field(TTTRun)
    short_conv: int = 4  # kernel of the convolutions on q and k (official conv_width 4); 0 for none
    rope: bool = True  # RoPE on q and k at the position within the mini-batch

    def check(self, width: int) -> None:
        check_knobs(self, choices={"run.form": FORMS, "inner": INNERS}, positive=("expansion", "mini_batch"),
                    width=width)
        if self.rope and (width // self.heads) % 2:
            raise ValueError(f"mixer.rope needs an even head width, not {width // self.heads}; set mixer.rope=false")
        if self.base_lr <= 0:
            raise ValueError(f"mixer.base_lr={self.base_lr} must be positive")

    def state_size(self, width: int, seq_len: int) -> int:
        """The weights and the open mini-batch's change of them per head (and the MLP's decay product, always 1),
        and the convolution's window."""
        d, hidden = width // self.heads, self.expansion * width // self.heads
        params = d * d + d if self.inner == "linear" else 2 * d * hidden + hidden + d
        return self.heads * (2 * params + (self.inner == "mlp")) + max(self.short_conv - 1, 0) * width

    def cell(self) -> Cell:
        return "uniform", self.inner, "minibatch", "learned"

    def at_cell(self, cell: Cell, mini_batch: int, heads: int, write_strength: str | None = None
                ) -> TTTConfig | None:
        """Only its own cell (the grid's other minibatch cells are the Titans layer's), with its learned rate."""
        if cell != self.cell() or write_strength == "none":
            return None
        return dataclasses.replace(self, mini_batch=mini_batch, heads=heads)

    def flops(self, model, B: int, T: int, Q: int | None, input_grad: bool, once: bool = False) -> Counter:
        """The shared q/k map and v's, each of q and k through its own biased convolution and RoPE
        within the mini-batch, the learned per-token rate, the memory trained by mini-batch gradient steps (the
        dual form), the read's LayerNorm over the width, its GELU gate and the output map."""
        c, D = self, model.width
        count.training_form(c, "dual")
        H, d, N, R = c.heads, D // c.heads, B * T, B * (Q or T)
        grads = 2 if input_grad else 1
        parts = Counter()
        # q/k, v and the gate (made at every token, read at R) and the rate's map; the output map
        parts["mixer/projections"] += (3 * count.matmul(N, D, D, grads) + count.matmul(N, D, H, grads) + 2 * N * H
                                       + count.matmul(R, D, D))
        if c.short_conv:  # two filters over the one map, with biases and no SiLU; backward, their input gradients added
            conv = count.short_conv(B, T, D, c.short_conv) - count.elementwise(N * D, count.SILU) + 2 * N * D
            parts["mixer/conv"] += 2 * conv + N * D
        gates = 12 * N * D if c.rope else 0  # q and k: x1 cos - x2 sin, x2 cos + x1 sin, and back
        # lr = base_lr sigmoid(.) / d (XLA drops a product with one); the GELU gate, its product and two gradients
        gates += count.elementwise(N * H, count.SIGMOID) + 2 * N * H * (1 + (c.base_lr != 1.0))
        # reading at Q: two gathers' scatters
        gates += count.elementwise(R * D, count.GELU) + 3 * R * D + (2 * R * D if Q else 0)
        parts["mixer/gates"] += gates
        parts["norms"] += count.norm("layernorm", R * D)
        if c.inner == "linear":
            parts["mixer/memory"] += count.ttt_dual(B * H, T, d, c.mini_batch, once)
        else:  # TTT-MLP: the gradient memory with the reading position's factor, neither decay nor momentum
            parts["mixer/memory"] += count.gradient_memory(B * H, T, c.mini_batch, [d, c.expansion * d, d], bias=True,
                                                     norm=True, tok=True, decay_grad=False, momentum=False, once=once,
                                                     reads=Q)
        return parts


@struct.dataclass
class TTTState(MixerState):
    """The memory and the convolution's last inputs. `length % mini_batch` is where in the mini-batch it stopped.

    The memory of TTT-Linear is (W [B, H, d, d], b [B, H, d]) the open mini-batch started from and its
    rate-weighted gradient sums (dW, db); TTT-MLP's is tmem.memory.gradient's (M_0, U, A, None).
    """

    memory: tuple
    conv: jax.Array | None

    def matrix(self, layer: TTT) -> jax.Array:
        """TTT-Linear's weights the last token read with, W_0 - tok_i dW when a mini-batch is open."""
        if layer.cfg.inner != "linear":
            raise NoMatrix("an MLP memory")
        W, _, dW, _ = self.memory
        return W - layer.token_lr()[(self.length - 1) % layer.cfg.mini_batch] * dW


class TTT(Mixer):
    """A TTT-Linear or TTT-MLP layer; the final state is sown as the `state` intermediate and the keys (the inner
    model's training inputs) as `keys`."""

    sows = frozenset({"state", "keys"})

    def __init__(self, cfg: TTTConfig, width: int, *, rope: bool, rngs: nnx.Rngs):
        del rope  # the layer's own RoPE, within the mini-batch (cfg.rope)
        self.cfg = cfg
        H, self.d = cfg.heads, width // cfg.heads
        linear = lambda n_out: nnx.Linear(width, n_out, use_bias=False, rngs=rngs)  # noqa: E731
        self.qk, self.v, self.gate, self.out = linear(width), linear(width), linear(width), linear(width)
        if cfg.short_conv:
            self.conv_q, self.conv_k = (ShortConv(width, cfg.short_conv, bias=True, rngs=rngs) for _ in range(2))
        normal = lambda shape: INIT_STD * jax.random.normal(rngs.params(), shape)  # noqa: E731
        if cfg.inner == "linear":
            self.W0, self.b0 = nnx.Param(normal((H, self.d, self.d))), nnx.Param(jnp.zeros((H, self.d)))
        else:
            mlp = gradient.init_params(self.mlp, H, self.d, cfg.expansion * self.d, rngs.params(), INIT_STD)
            self.W1, self.b1, self.W2, self.b2 = (nnx.Param(mlp[name]) for name in ("W1", "b1", "W2", "b2"))
        self.ttt_scale, self.ttt_bias = nnx.Param(jnp.ones((H, self.d))), nnx.Param(jnp.zeros((H, self.d)))
        self.lr_kernel, self.lr_bias = nnx.Param(normal((width, H))), nnx.Param(jnp.zeros((H,)))
        self.token_offset = nnx.Param(jnp.zeros((cfg.mini_batch,)))
        self.post_norm = nnx.LayerNorm(width, epsilon=1e-6, rngs=rngs)

    mlp = gradient.Inner("mlp", bias=True, norm=True)

    def token_lr(self) -> jax.Array:
        """The reading position's factor tok_i = max(0, 1/(i+1) + offset_i) [mini_batch]: a read at place i of
        its mini-batch sees the weights W_0 - tok_i dW (tmem.memory.ttt.dual)."""
        return jnp.maximum(1.0 / jnp.arange(1, self.cfg.mini_batch + 1) + self.token_offset[...], 0.0)

    def initial_state(self, B: int):
        """TTT-Linear's (W, b, dW, db) from the initial weights (TTT-MLP's memory makes its own)."""
        H, d = self.cfg.heads, self.d
        W = jnp.broadcast_to(self.W0[...][None], (B, H, d, d))
        b = jnp.broadcast_to(self.b0[...][None], (B, H, d))
        return W, b, jnp.zeros((B, H, d, d)), jnp.zeros((B, H, d))

    def __call__(self, x_btd, *, state: TTTState | None = None, head_mask=None, read_at=None, qk_positions=None):
        """The protocol's call (tmem.mixers.base.Mixer)."""
        del qk_positions
        cfg, (B, T, D), H = self.cfg, x_btd.shape, self.cfg.heads
        start = 0 if state is None else state.length
        xqk, v = self.qk(x_btd), self.v(x_btd)
        q = k = xqk
        tail = None
        if cfg.short_conv:  # two filters over the one shared projection: one tail serves both
            prev = None if state is None else state.conv
            q, tail = self.conv_q(xqk, prev)
            k, _ = self.conv_k(xqk, prev)
        q, k, v = (y.reshape(B, T, H, self.d) for y in (q, k, v))
        if cfg.rope:
            place = (start + jnp.arange(T)) % cfg.mini_batch
            q, k = rope(q, place), rope(k, place)
        self.sow(nnx.Intermediate, "keys", k, capture_noop=True)  # the inner model's training inputs
        lr = cfg.base_lr * jax.nn.sigmoid(x_btd @ self.lr_kernel[...] + self.lr_bias[...][None, None]) / self.d
        token_lr = self.token_lr()
        memory = None if state is None else state.memory
        ln = self.ttt_scale[...], self.ttt_bias[...]
        if cfg.inner == "linear":
            form = ttt.dual if cfg.run.form == "dual" else ttt.recurrent
            o, memory = form(q, k, v, lr=lr, token_lr=token_lr, ln_scale=ln[0], ln_bias=ln[1],
                             state=self.initial_state(B) if memory is None else memory,
                             mini_batch=cfg.mini_batch, start=start % cfg.mini_batch)
            o = at_positions(o, read_at)
        else:  # the gradient memory reads at read_at itself
            form = gradient.parallel if cfg.run.form == "dual" else gradient.recurrent
            initial = {name: getattr(self, name)[...] for name in ("W1", "b1", "W2", "b2")}
            o, memory = form(q, k, v, inner=self.mlp, theta=lr, tok=token_lr, ln=ln, state=memory, initial=initial,
                             mini_batch=cfg.mini_batch, start=start % cfg.mini_batch, read_at=read_at)
        self.sow(nnx.Intermediate, "state", memory, capture_noop=True)
        o = mask_heads(o, head_mask).reshape(B, -1, D)
        o = self.post_norm(o) * jax.nn.gelu(at_positions(self.gate(x_btd), read_at), approximate=True)
        return self.out(o), TTTState(tuple(memory), tail, length=start + T)
