"""The titans row: a neural memory trained by gradient descent with momentum and a forget gate (Behrouz et al. 2025).

The memory (tmem/memory/gradient.py) is an MLP (or a linear map) per head,
by default wrapped as x + LN(m(x)), updated at every token by

    S_t = eta_t S_{t-1} - theta_t grad l_t(M_0),   M_t = (1 - alpha_t) M_{t-1} + S_t,

on the half-loss l_t = 1/2 ||m(k_t) - v_t||^2 (Titans writes the full square
loss; its theta is half of theta here), gradients taken at the weights M_0 the
mini-batch of `mini_batch` tokens started from (the paper's parallel
training), and read y_t = m(q_t) at M_t. The layer follows the paper and
anchors/mixers.md 4.2: q, k, v projections, each through a short causal
convolution and SiLU, unit (L2-normalised) q and k, the three rates per head
from the token, theta_t = base_lr sigmoid(W_theta x + c) / d, eta_t = sigmoid(W_eta x + c)
and alpha_t = sigmoid(W_alpha x + c), an RMSNorm of each head's read and the
output map. The initial memory is a slow weight (an MLP from zero would have
zero gradient).

The same layer is every iterative cell of the `regression` grid that no
other row names: `momentum=false` is plain mini-batch or per-token SGD,
`forget` none | fixed (RetNet's decay per head) | gate (Titans'), and
`mini_batch=null` one gradient step from the initial memory.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from functools import partial

import jax
import jax.numpy as jnp
from flax import nnx, struct

from tmem.layers import ShortConv, l2_normalize, short_conv
from tmem.memory import gradient
from tmem.memory.linear_state import retnet_log_decay
from tmem.mixers import flops as count
from tmem.mixers.base import (FORGET_OF_WEIGHTS, Cell, Mixer, MixerConfig, MixerState, NoMatrix, Recipe, Run,
                              check_knobs, mask_heads, recommended, run_field)

FORMS = ("parallel", "recurrent")
FORGETS = ("none", "fixed", "gate")
INITIALS = ("learned", "zero")
INIT_STD = 0.02  # the initial memory's weights, as TTT's official initializer_range
FORGET_BIAS = -5.0  # alpha starts near 0.007: the memory starts nearly without forgetting


@dataclasses.dataclass(frozen=True)
class TitansRun(Run):
    form: str = "parallel"  # parallel (training: mini-batch by mini-batch) | recurrent (the definition)
    # what the parallel form's blocks keep for the backward pass: matmuls (their outputs only, the elementwise work
    # computed again: Titans' step 0.79 of keeping all on a CPU) | all (tmem/memory/gradient.py's SAVED)
    saved: str = "matmuls"


@dataclasses.dataclass(frozen=True)
class TitansConfig(MixerConfig):
    name: str = "titans"
    recipe: Recipe = recommended(lr=1e-2)
    heads: int = 4
    function: str = "mlp"  # the memory: mlp (GELU, hidden = expansion x head width) | linear
    expansion: int = 4
    bias: bool = True  # biases in the memory's layers
    inner_norm: bool = True  # the memory as x + LN(m(x)), target v - k (TTT's and fla's form); false: m(x), target v
    # the inner rate theta_t = base_lr sigmoid(W_theta x + c) / d on the half-loss: the 1/d of a loss averaged
    # over the head's d features, as lucidrains' titans-pytorch (max_lr 1 there is base_lr 2 here), and TTT's
    base_lr: float = 1.0
    mini_batch: int | None = 16  # tokens whose gradients are taken at the same weights; null: the whole sequence
    momentum: bool = True
    forget: str = "gate"  # the memory's decay 1 - alpha_t: none | fixed (per head) | gate (from the token)
    initial: str = "learned"  # the initial memory: learned (a slow weight) | zero (linear memories only)
    run: TitansRun = run_field(TitansRun)
    short_conv: int = 4  # kernel of the causal convolutions (with SiLU) on q, k, v; 0 for none

    def check(self, width: int) -> None:
        check_knobs(self, choices={"function": gradient.FUNCTIONS, "run.form": FORMS, "forget": FORGETS,
                                   "initial": INITIALS, "run.saved": tuple(gradient.SAVED)},
                    positive=("mini_batch", "expansion"), width=width)
        if self.base_lr <= 0:
            raise ValueError(f"mixer.base_lr={self.base_lr} must be positive")
        if self.function == "mlp" and self.initial == "zero":
            raise ValueError("mixer.initial=zero with an MLP memory: every gradient of an MLP at zero is zero, so it "
                             "would never learn; use mixer.initial=learned")

    @property
    def inner(self) -> gradient.Inner:
        return gradient.Inner(self.function, self.bias, self.inner_norm)

    def state_size(self, width: int, seq_len: int) -> int:
        """M_0, the change U and the momentum S (each the memory's parameters), A, and the convolutions' window."""
        d = width // self.heads
        hidden = self.expansion * d
        params = d * d + d * self.bias if self.function == "linear" else 2 * d * hidden + (hidden + d) * self.bias
        return self.heads * ((2 + self.momentum) * params + 1) + max(self.short_conv - 1, 0) * 3 * width

    def cell(self) -> Cell:
        optimizer = "momentum" if self.momentum else {1: "sgd", None: "one_step"}.get(self.mini_batch, "minibatch")
        weights = next(w for w, forget in FORGET_OF_WEIGHTS.items() if forget == self.forget)
        return weights, self.function, optimizer, self.initial

    def at_cell(self, cell: Cell, mini_batch: int, heads: int, write_strength: str | None = None
                ) -> TitansConfig | None:
        """Every cell of an iterative or one-step optimiser: the gradient memory with momentum, forgetting and
        mini-batch set by the cell (sgd: a mini-batch of one token; one_step: one of the whole sequence), always
        with its learned rate theta_t."""
        weights, function, optimizer, initial = cell
        if optimizer == "exact" or write_strength == "none":
            return None
        return dataclasses.replace(self, function=function, initial=initial, momentum=optimizer == "momentum",
                                   forget=FORGET_OF_WEIGHTS[weights], heads=heads,
                                   mini_batch={"sgd": 1, "one_step": None}.get(optimizer, mini_batch))

    def flops(self, model, B: int, T: int, Q: int | None, input_grad: bool, once: bool = False) -> Counter:
        """Q, k, v through the short convolution
        with SiLU, unit q and k, the rates theta, eta and alpha from the token, the gradient memory (a scan over
        mini-batches), each head's RMSNorm and the output map."""
        c, D = self, model.width
        count.training_form(c, "parallel")
        H, d, N, R = c.heads, D // c.heads, B * T, B * (Q or T)
        grads = 2 if input_grad else 1
        parts = Counter()
        rates = 1 + c.momentum + (c.forget == "gate")  # theta, eta, alpha: a map of x each, with a bias
        parts["mixer/projections"] += (3 * count.matmul(N, D, D, grads)
                                       + rates * (count.matmul(N, D, H, grads) + 2 * N * H))
        parts["mixer/projections"] += count.matmul(R, D, D)
        if c.short_conv:
            parts["mixer/conv"] += count.short_conv(B, T, 3 * D, c.short_conv)
        # unit q and k; theta = base_lr sigmoid(.) / d (XLA drops a product with one); reading at Q, the read's
        # gradient scattered back
        gates = (count.elementwise(2 * N * D, count.L2_NORMALIZE) + count.elementwise(N * H, count.SIGMOID)
                 + 2 * N * H * (1 + (c.base_lr != 1.0)))
        gates += R * D if Q else 0
        if c.momentum:  # log eta = log_sigmoid(.)
            gates += count.elementwise(N * H, count.LOG_SIGMOID)
        if c.forget == "gate":  # log(1 - alpha) = log_sigmoid(-.), and the negation's gradient
            gates += count.elementwise(N * H, count.LOG_SIGMOID) + 2 * N * H
        parts["mixer/gates"] += gates
        parts["norms"] += count.norm("rmsnorm", R * D)
        widths = [d, c.expansion * d, d] if c.function == "mlp" else [d, d]
        parts["mixer/memory"] += count.gradient_memory(B * H, T, c.mini_batch, widths, c.bias, c.inner_norm, tok=False,
                                                 decay_grad=c.forget == "gate", momentum=c.momentum, once=once, reads=Q)
        return parts


@struct.dataclass
class GradientState(MixerState):
    """The memory's (M_0, U, A, S) of tmem.memory.gradient and the convolutions' last inputs."""

    memory: tuple
    conv: jax.Array | None

    def matrix(self, layer: Titans) -> jax.Array:
        """A linear memory's weights now, A M_0 + U."""
        if layer.cfg.function != "linear":
            raise NoMatrix("an MLP memory")
        M0, U, A, _ = self.memory
        return A[..., None, None] * M0["W1"] + U["W1"]


class Titans(Mixer):
    """A Titans layer (and the grid's iterative cells); the final memory is sown as the `state` intermediate and
    the keys it was trained on as `keys`."""

    sows = frozenset({"state", "keys"})

    def __init__(self, cfg: TitansConfig, width: int, *, rope: bool, rngs: nnx.Rngs):
        del rope  # positions come from the convolutions and the forget gate
        self.cfg = cfg
        H, self.d = cfg.heads, width // cfg.heads
        linear = lambda n_out, bias=False: nnx.Linear(width, n_out, use_bias=bias, rngs=rngs)  # noqa: E731
        self.q, self.k, self.v = linear(width), linear(width), linear(width)
        if cfg.short_conv:
            self.conv_q, self.conv_k, self.conv_v = (ShortConv(width, cfg.short_conv, rngs=rngs) for _ in range(3))
        self.theta = linear(H, bias=True)
        if cfg.momentum:
            self.eta = linear(H, bias=True)
        if cfg.forget == "gate":
            self.alpha = linear(H, bias=True)
            self.alpha.bias[...] = jnp.full((H,), FORGET_BIAS)
        memory = gradient.init_params(cfg.inner, H, self.d, cfg.expansion * self.d, rngs.params(), INIT_STD,
                                      zero=cfg.initial == "zero")
        self.memory_names = tuple(memory)
        for name, value in memory.items():  # memory_W1, memory_b1, ...: the initial memory, a slow weight
            setattr(self, f"memory_{name}", nnx.Param(value))
        if cfg.inner_norm:
            self.ln_scale, self.ln_bias = nnx.Param(jnp.ones((H, self.d))), nnx.Param(jnp.zeros((H, self.d)))
        self.norm = nnx.RMSNorm(self.d, epsilon=1e-5, rngs=rngs)
        self.out = linear(width)

    def initial_memory(self) -> dict:
        return {name: getattr(self, f"memory_{name}")[...] for name in self.memory_names}

    def rates(self, x_btd):
        """theta_t, log(1 - alpha_t) (None: no forgetting) and log eta_t (None: no momentum), each [B, T, H]."""
        cfg, (B, T, _), H = self.cfg, x_btd.shape, self.cfg.heads
        theta = cfg.base_lr * jax.nn.sigmoid(self.theta(x_btd)) / self.d
        log_a = None
        if cfg.forget == "fixed":
            log_a = jnp.broadcast_to(retnet_log_decay(H), (B, T, H))
        elif cfg.forget == "gate":
            log_a = jax.nn.log_sigmoid(-self.alpha(x_btd))  # log(1 - sigmoid(z))
        log_eta = jax.nn.log_sigmoid(self.eta(x_btd)) if cfg.momentum else None
        return theta, log_a, log_eta

    def __call__(self, x_btd, *, state: GradientState | None = None, head_mask=None, read_at=None,
                 qk_positions=None):
        """The protocol's call (tmem.mixers.base.Mixer)."""
        del qk_positions  # validation gives it only to rows that take it
        cfg, (B, T, D), H = self.cfg, x_btd.shape, self.cfg.heads
        start = 0 if state is None else state.length
        q, k, v = self.q(x_btd), self.k(x_btd), self.v(x_btd)
        tail = None
        if cfg.short_conv:  # the three filters as one, over q, k and v side by side
            kernel = jnp.concatenate([c.kernel[...] for c in (self.conv_q, self.conv_k, self.conv_v)], axis=1)
            qkv, tail = short_conv(jnp.concatenate([q, k, v], -1), kernel, None if state is None else state.conv,
                                   silu=True)
            q, k, v = jnp.split(qkv, 3, axis=-1)
        q, k = (l2_normalize(y.reshape(B, T, H, self.d)) for y in (q, k))
        self.sow(nnx.Intermediate, "keys", k, capture_noop=True)  # the unit keys the memory is trained on
        v = v.reshape(B, T, H, self.d)
        theta, log_a, log_eta = self.rates(x_btd)
        ln = (self.ln_scale[...], self.ln_bias[...]) if cfg.inner_norm else None
        form = (partial(gradient.parallel, saved=cfg.run.saved) if cfg.run.form == "parallel"
                else gradient.recurrent)
        o, memory = form(q, k, v, inner=cfg.inner, theta=theta, log_a=log_a, log_eta=log_eta, ln=ln,
                         state=None if state is None else state.memory, initial=self.initial_memory(),
                         mini_batch=cfg.mini_batch, start=start, read_at=read_at)
        self.sow(nnx.Intermediate, "state", memory, capture_noop=True)
        o = mask_heads(self.norm(o), head_mask)
        return self.out(o.reshape(B, -1, D)), GradientState(memory, tail, length=start + T)
