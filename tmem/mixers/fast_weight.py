"""The fast-weight rows of the unified table: linear, RetNet, GLA, Mamba-2, DeltaNet, Gated DeltaNet.

One module with knobs, because the rows are one write (tmem.memory.linear_state)
that differs in three choices, plus the shared projections around it:

| row            | rule  | decay a_t                          | write strength beta_t |
|----------------|-------|------------------------------------|-----------------------|
| linear         | add   | none                               | 1                     |
| retnet         | add   | fixed per head, 1 - 2^(-5-h)       | 1                     |
| gla            | add   | vector: sigmoid(W2 W1 x)^(1/16)    | 1                     |
| mamba2         | add   | scalar: exp(-exp(A_log) dt_t)      | dt_t = softplus(W x + dt_bias) |
| deltanet       | delta | none                               | sigmoid(W x)          |
| gated_deltanet | delta | scalar: exp(-exp(A_log) dt_t)      | sigmoid(W x)          |

Around the write: q, k, v projections, an optional short causal convolution
(with SiLU) on them, a feature map on q and k, optional L2 normalisation of q
and k, the q scale, an optional normaliser (linear attention's z_t, kept as an
extra value column of ones), Mamba-2's skip D v, and an RMSNorm of the
read-out (per head, or over the whole width as Mamba-2's) with an optional gate
(SiLU or sigmoid) after it or, as in Mamba-2, before it. q and k may be shared
by groups of heads (Mamba-2's B and C: one group for all heads). The state is
key-major (d_k x d_v per head, read S^T q), the transpose of the note's S.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
import itertools
import math

import jax
import jax.numpy as jnp
from flax import nnx, struct

from tmem.layers import Fixed, ShortConv, dense, l2_normalize, linear, rms_norm, short_conv
from tmem.memory.chunked import chunked
from tmem.memory.features import FEATURE_MAPS, feature_map, feature_width, random_features
from tmem.memory.linear_state import recurrent, retnet_log_decay
from tmem.mixers.fast_weight_flops import GLA_RANK, fast_weight_flops
from tmem.mixers.base import (GATE_ACTIVATIONS, Cell, Mixer, MixerConfig, MixerState, Run, at_positions,
                              knob, mask_heads, run_field)

RULES = ("add", "delta")
# the regression grid's weights gamma as the decay of a write one token at a time (a linear memory from zero, one
# step or the delta rule); GLA's per-channel decay is no weight on pairs, so no cell
WEIGHTS_OF_DECAY = {"none": "uniform", "fixed": "decay", "scalar": "gate"}
DECAYS = ("none", "fixed", "scalar", "vector")
WRITE_STRENGTHS = ("one", "sigmoid", "dt")
FORMS = ("chunked", "recurrent")
NORM_OVER = ("head", "width")

# Initialisations of the reference layers (anchors/mixers.md): Mamba-2's A ~ U(1, 16) (mixer.a_range) and
# dt ~ logU(1e-3, 1e-1); GLA's low-rank gate with temperature 16.
A_RANGE, DT_RANGE = (1.0, 16.0), (1e-3, 1e-1)
GLA_TEMPERATURE = 16.0
NORMALISER_EPS = 1e-6
# A delta rule with keys this wide or narrower evaluates in the token scan (eval_form=auto): at four heads of 16 it
# was faster than the chunked form (DeltaNet 261 against 339 ms, Gated DeltaNet 357 against 425) and compiled 1 s
# sooner; with keys of 32 or 64 the chunked form evaluates faster, paying back its longer compile within a run
# (BENCHMARKS.md, "Held-out evaluation in smaller passes")
DELTA_SCAN_KEY_WIDTH = 16


@dataclasses.dataclass(frozen=True)
class FastWeightRun(Run):
    """How the fast-weight rows compute the write: the same function in every form (tests/test_chunked.py)."""

    form: str = "chunked"  # chunked (training) | recurrent (the definition, one token at a time)
    # the form held-out evaluations read in, the same function (null: form). auto: the token scan for a delta rule
    # with keys of at most DELTA_SCAN_KEY_WIDTH, where it evaluates and compiles faster without a backward, else form
    eval_form: str | None = "auto"
    # tokens per chunk, fla's 64: a sequence that fits in one is the quadratic form with no loop (BENCHMARKS.md)
    chunk: int = 64
    sub_chunk: int = 4  # a vector decay too strong for one reference keeps its decays in blocks of this size


@dataclasses.dataclass(frozen=True)
class FastWeightConfig(MixerConfig):
    """The knobs of the fast-weight rows; the defaults are the linear row, and each row's YAML sets what differs."""

    name: str = "linear"
    run: FastWeightRun = run_field(FastWeightRun)
    rule: str = "add"  # add | delta (write the error v - S^T k)
    decay: str = "none"  # none | fixed (RetNet) | scalar (Mamba-2 style, per head) | vector (GLA, per key channel)
    write_strength: str = "one"  # beta_t: one | sigmoid (of a projection) | dt (Mamba-2's step)
    heads: int = 4
    # heads that share one q and one k (Mamba-2's C and B, its n_groups): None gives each head its own; must
    # divide heads. Not softmax's kv_heads: here the values stay per head and the keys and queries are shared.
    qk_groups: int | None = None
    # d_k of each group of q and k before the feature map; None: the model's width split over the groups,
    # width // groups: each head's share, or all of it for one group that every head shares (Mamba-2's B and C),
    # whose width costs no parameters per head
    key_width: int | None = None
    value_width: int | None = None  # d_v per head; None: expand * width // heads
    # the values' total width H d_v as a multiple of the model's, where value_width is None (Mamba-2's expand): 1
    # for fla's rows; Mamba-2's 1/2 pays for its B and C as wide as the model (configs/mixer/mamba2.yaml)
    expand: float = 1.0
    # identity | elu (elu + 1) | relu | dpfp (expands d_k to 2 nu d_k) | taylor (Based's: 1 + d_k + d_k^2, its
    # kernel 1 + q.k/sqrt(d_k) + (q.k)^2/(2 d_k) carries its own scale, so pair it with q_scale=1) | performer
    # (num_features positive random features whose normalised read approximates softmax's exp(q.k/sqrt(d_k)): its
    # own scale too, and it needs normalize)
    feature_map: str = "identity"
    dpfp_nu: int = 1
    num_features: int = 64  # performer's m, d_phi: the kernel's error falls as m^(-1/2)
    # performer's projections in orthogonal blocks (the paper's default, a smaller error), else independent
    orthogonal_features: bool = True
    normalize: bool = False  # divide the read by q . z_t, z_t the (decayed) sum of keys
    q_scale: float | None = None  # None: d_phi^(-1/2)
    qk_norm: str = "none"  # none | rms (RMSNorm with a gain) | l2 (unit q and k; the delta rule needs unit keys)
    # kernel of the causal depthwise convolution on q, k, v: the previous-token view a sum over the past
    # cannot compute; 0 for none
    short_conv: int = 4
    conv_bias: bool = False  # a bias on the short convolution (Mamba-2's conv1d has one; fla's other layers not)
    skip: bool = False  # Mamba-2's D: add D_h v_t to the read
    output_norm: bool = True  # RMSNorm of the read
    output_norm_over: str = "head"  # head (fla's, each head's d_v alone) | width (Mamba-2's: all heads together)
    output_gate: bool = False  # multiply the read by gate_activation(W_g x)
    # the gate's place: after the norm, RMSNorm(o) * g (fla) | before it, RMSNorm(o * g) (Mamba-2's
    # norm_before_gate=False)
    gate_before_norm: bool = False
    gate_activation: str = "silu"  # silu (fla, Mamba-2) | sigmoid: starts at 1/2, not near 0 (MEMORY.md: small heads)
    # the scalar decay's A = exp(A_log) starts uniform in this range (Mamba-2's A_init_range, (1, 16)): with dt the
    # decay is exp(-A dt), so a smaller A starts the memory forgetting more slowly (Mamba-2's row: (0.1, 1), MEMORY.md)
    a_range: tuple[float, float] = A_RANGE
    # the vector decay's gate logits start at this bias (fla's GLA: 0, a decay of 0.958 a token); a forget gate
    # that starts open, as in LSTMs: at 4 (0.9989 a token) GLA reaches 0.99 in fewer steps (MEMORY.md)
    forget_bias: float = 0.0
    # no RoPE and no shortformer positions: position comes from the short convolution and the decay

    def check(self, width: int) -> None:
        for field, allowed in (("rule", RULES), ("decay", DECAYS), ("write_strength", WRITE_STRENGTHS),
                               ("feature_map", FEATURE_MAPS), ("qk_norm", ("none", "rms", "l2")), ("run.form", FORMS),
                               ("gate_activation", tuple(GATE_ACTIVATIONS)), ("output_norm_over", NORM_OVER)):
            value = knob(self, field)
            if value not in allowed:
                raise ValueError(f"mixer.{field}={value!r} is not one of: {', '.join(allowed)}")
        if self.run.eval_form not in (None, "auto", *FORMS):
            raise ValueError(f"mixer.run.eval_form={self.run.eval_form!r} is not one of: null, auto, "
                             f"{', '.join(FORMS)}")
        for field in ("heads", "run.chunk", "run.sub_chunk", "dpfp_nu", "num_features", "key_width", "value_width",
                      "qk_groups"):
            value = knob(self, field)
            if value is not None and value < 1:
                raise ValueError(f"mixer.{field}={value} must be positive")
        if self.short_conv < 0:
            raise ValueError(f"mixer.short_conv={self.short_conv} must be 0 (none) or a kernel size")
        if self.qk_groups is not None and self.heads % self.qk_groups:
            raise ValueError(f"mixer.qk_groups={self.qk_groups} must divide mixer.heads={self.heads}")
        if self.expand <= 0:
            raise ValueError(f"mixer.expand={self.expand} must be positive")
        if self.key_width is None and width % self.groups:
            which = "qk_groups" if self.qk_groups else "heads"
            raise ValueError(f"mixer.{which}={self.groups} must divide model.width={width}")
        total = self.values_total(width)
        if self.value_width is None and (not total.is_integer() or total % self.heads):
            named = f"model.width={width}" if self.expand == 1 else f"mixer.expand x model.width={total:g}"
            raise ValueError(f"mixer.heads={self.heads} must divide {named}")
        if self.rule == "delta" and self.qk_norm != "l2":
            raise ValueError("mixer.qk_norm must be l2 with rule=delta: the delta write is stable for unit keys only")
        if self.write_strength == "dt" and self.decay != "scalar":
            raise ValueError("mixer.write_strength=dt needs decay=scalar, which defines dt")
        if len(self.a_range) != 2 or not 0 < self.a_range[0] <= self.a_range[1]:
            raise ValueError(f"mixer.a_range={list(self.a_range)} must be [low, high] with 0 < low <= high")
        if self.a_range != A_RANGE and self.decay != "scalar":
            raise ValueError(f"mixer.a_range={list(self.a_range)} needs decay=scalar, whose A it draws")
        if self.forget_bias and self.decay != "vector":
            raise ValueError(f"mixer.forget_bias={self.forget_bias} needs decay=vector, whose gate it starts")
        if self.normalize and (self.rule != "add" or self.feature_map == "identity"):
            raise ValueError("mixer.normalize needs rule=add and a positive kernel (feature_map elu, relu, dpfp, "
                             "taylor, performer)")
        if self.feature_map == "performer" and not self.normalize:
            raise ValueError("mixer.feature_map=performer needs mixer.normalize=true: its features estimate "
                             "exp(q.k/sqrt(d_k)), a softmax only once divided by their sum")

    @property
    def groups(self) -> int:
        """How many distinct q and k projections: qk_groups, or one per head."""
        return self.qk_groups or self.heads

    def values_total(self, width: int) -> float:
        """expand x width, the values' total width where value_width is None; rounded off where float products
        miss a whole number (0.1 x 30 is 3.0000000000000004)."""
        total = self.expand * width
        return float(round(total)) if abs(total - round(total)) < 1e-9 else total

    def widths(self, width: int) -> tuple[int, int, int]:
        """d_k, d_phi (the state's key width) and d_v: each head's, its q and k shared by its group's heads."""
        d_key = self.key_width or width // self.groups
        d_value = self.value_width or int(self.values_total(width)) // self.heads
        return d_key, feature_width(self.feature_map, d_key, self.dpfp_nu, self.num_features), d_value

    def fit(self, task, width: int) -> FastWeightConfig:
        """run.eval_form=auto made concrete: it depends on the keys' width, which the model's width decides."""
        if self.run.eval_form != "auto":
            return self
        scan = self.rule == "delta" and self.widths(width)[0] <= DELTA_SCAN_KEY_WIDTH
        return self.with_run(eval_form="recurrent" if scan else None)

    def for_evaluation(self) -> FastWeightConfig:
        """The run.eval_form's layer; an auto that `fit` has not resolved (no width known) evaluates in the form."""
        if self.run.eval_form in (None, "auto"):
            return self
        return self.with_run(form=self.run.eval_form, eval_form=None)

    def state_size(self, width: int, seq_len: int) -> int:
        """The fast-weight matrices (d_phi x d_v per head, plus the normaliser) and the convolution's window."""
        d_key, d_phi, d_value = self.widths(width)
        memory = self.heads * d_phi * (d_value + self.normalize)
        window = max(self.short_conv - 1, 0) * (2 * self.groups * d_key + self.heads * d_value)
        return memory + window

    def cell(self) -> Cell | None:
        if self.decay not in WEIGHTS_OF_DECAY:
            return None
        return WEIGHTS_OF_DECAY[self.decay], "linear", "sgd" if self.rule == "delta" else "one_step", "zero"

    def at_cell(self, cell: Cell, mini_batch: int, heads: int, write_strength: str | None = None
                ) -> FastWeightConfig | None:
        """The same write with the cell's weights as its decay: from the row of the cell's optimizer; a learned
        strength is the row's own (Mamba-2's dt, DeltaNet's sigmoid), or a sigmoid where the row has none."""
        if self.cell() is None or cell[1:] != self.cell()[1:]:
            return None
        decay = next(decay for decay, weights in WEIGHTS_OF_DECAY.items() if weights == cell[0])
        strength = {None: self.write_strength, "none": "one",
                    "learned": "sigmoid" if self.write_strength == "one" else self.write_strength}[write_strength]
        return dataclasses.replace(self, decay=decay, heads=heads, write_strength=strength)

    def flops(self, model, B: int, T: int, Q: int | None, input_grad: bool, once: bool = False) -> Counter:
        """One fused projection, the short convolution, feature map, norms, gates,
        the memory (chunked, or recurrent: a scan over tokens), and the read's output norm and gate."""
        return fast_weight_flops(self, model, B, T, Q, input_grad, once)


@struct.dataclass
class FastWeightState(MixerState):
    """The memory S [B, H, d_phi, d_v(+1)] and the short convolutions' last inputs."""

    memory: jax.Array
    conv: jax.Array | None  # the convolutions' last K-1 inputs [B, K-1, channels of q, k, v side by side]

    def matrix(self, layer: FastWeight) -> jax.Array:
        """S without linear attention's normaliser column."""
        return self.memory[..., :layer.d_value]

    def with_matrix(self, layer: FastWeight, matrix: jax.Array) -> FastWeightState:
        """S replaced; linear attention's normaliser column kept."""
        return self.replace(memory=self.memory.at[..., :layer.d_value].set(matrix.astype(self.memory.dtype)))


def _inverse_softplus(y):
    return y + jnp.log(-jnp.expm1(-y))


class FastWeight(Mixer):
    """A fast-weight memory layer: project, write every token into the state, read it with the queries.

    Sown under nnx.capture: the final `state`, the `keys` it wrote (after the convolution, feature map and
    normalisation), the `queries` it read with, and the keys' values, decays and strengths as `writes`.
    """

    sows = frozenset({"state", "keys", "queries", "writes"})

    def __init__(self, cfg: FastWeightConfig, width: int, *, rope: bool, rngs: nnx.Rngs):
        del rope  # these rows take positions from the convolution and the decay
        self.cfg = cfg
        H, G = cfg.heads, cfg.groups
        self.d_key, self.d_phi, self.d_value = d_key, d_phi, d_value = cfg.widths(width)
        layer = lambda n_in, n_out, bias=False: linear(n_in, n_out, bias=bias, rngs=rngs)  # noqa: E731
        self.q, self.k, self.v = layer(width, G * d_key), layer(width, G * d_key), layer(width, H * d_value)
        if cfg.short_conv:  # one per projection, as in fla: a shared one would mix q, k and v in one buffer
            conv = lambda n: ShortConv(n, cfg.short_conv, bias=cfg.conv_bias, rngs=rngs)  # noqa: E731
            self.conv_q, self.conv_k, self.conv_v = conv(G * d_key), conv(G * d_key), conv(H * d_value)
        if cfg.decay == "scalar":
            self.dt = layer(width, H)
            dt = jnp.exp(jax.random.uniform(rngs.params(), (H,), minval=math.log(DT_RANGE[0]),
                                            maxval=math.log(DT_RANGE[1])))
            self.dt_bias = nnx.Param(_inverse_softplus(dt))
            self.A_log = nnx.Param(jnp.log(jax.random.uniform(rngs.params(), (H,), minval=cfg.a_range[0],
                                                              maxval=cfg.a_range[1])))
        if cfg.decay == "vector":
            self.gate_down = layer(width, GLA_RANK)
            self.gate_up = linear(GLA_RANK, H * d_phi, bias=True, rngs=rngs,
                                  bias_init=nnx.initializers.constant(cfg.forget_bias))
        if cfg.write_strength == "sigmoid":
            self.beta = layer(width, H)
        if cfg.skip:
            self.D = nnx.Param(jnp.ones((H,)))
        if cfg.output_norm:
            self.norm = nnx.RMSNorm(d_value if cfg.output_norm_over == "head" else H * d_value, epsilon=1e-5,
                                    rngs=rngs)
        if cfg.output_gate:
            self.gate = layer(width, H * d_value)
        self.out = layer(H * d_value, width)
        if cfg.qk_norm == "rms":  # made last, so the rows without it draw their parameters as before
            self.q_norm, self.k_norm = (nnx.RMSNorm(d_phi, rngs=rngs) for _ in range(2))
        if cfg.feature_map == "performer":  # drawn once, kept in the checkpoint, never trained
            self.features = Fixed(random_features(rngs.params(), d_key, d_phi, cfg.orthogonal_features))

    def output_norm(self, o_bthd):
        """RMSNorm of the read [B, T, H, d_v], over each head's d_v or over all H d_v at once."""
        if self.cfg.output_norm_over == "head":
            return rms_norm(o_bthd, self.norm.scale[...], self.norm.epsilon)
        shape = o_bthd.shape
        return rms_norm(o_bthd.reshape(shape[:2] + (-1,)), self.norm.scale[...], self.norm.epsilon).reshape(shape)

    def projections(self, x_btd) -> dict[str, jax.Array]:
        """Every map that reads x (q, k, v and the gate, strength and decay inputs) as one matmul.

        Each keeps its own parameters; their kernels are put side by side for the
        call, because on a CPU one matmul of the summed width costs about what one
        of the small ones does (none of them has a bias).
        """
        names = [name for name in ("q", "k", "v", "gate", "beta", "dt", "gate_down") if hasattr(self, name)]
        kernels = [getattr(self, name).kernel[...] for name in names]
        y = dense(x_btd, jnp.concatenate(kernels, axis=1))
        ends = list(itertools.accumulate(w.shape[1] for w in kernels))
        return dict(zip(names, jnp.split(y, ends[:-1], axis=-1)))

    def decay_and_strength(self, p: dict[str, jax.Array]):
        """log a_t [B, T, H, 1 or d_phi] (None for no decay) and beta_t [B, T, H] (None for 1), from the projections."""
        cfg, H = self.cfg, self.cfg.heads
        B, T, _ = p["q"].shape
        log_a = beta = None
        if cfg.decay == "fixed":  # RetNet: gamma_h = 1 - 2^(-5-h), not learned
            log_a = jnp.broadcast_to(retnet_log_decay(H)[:, None], (1, T, H, 1))  # shared by the batch
        elif cfg.decay == "scalar":
            dt = jax.nn.softplus(p["dt"] + self.dt_bias[...][None, None])
            log_a = (-jnp.exp(self.A_log[...])[None, None] * dt)[..., None]
            if cfg.write_strength == "dt":
                beta = dt
        elif cfg.decay == "vector":
            logits = self.gate_up(p["gate_down"]).reshape(B, T, H, self.d_phi)
            log_a = jax.nn.log_sigmoid(logits) / GLA_TEMPERATURE
        if cfg.write_strength == "sigmoid":
            beta = jax.nn.sigmoid(p["beta"])
        return log_a, beta

    def __call__(self, x_btd, *, state: FastWeightState | None = None, head_mask=None, read_at=None,
                 qk_positions=None):
        """The protocol's call (tmem.mixers.base.Mixer)."""
        del qk_positions  # validation rejects shortformer for these rows
        cfg, (B, T, _), H = self.cfg, x_btd.shape, self.cfg.heads
        p = self.projections(x_btd)
        q, k, v = p["q"], p["k"], p["v"]
        tail = None
        if cfg.short_conv:  # the three filters as one, over q, k and v side by side
            convs = (self.conv_q, self.conv_k, self.conv_v)
            kernel = jnp.concatenate([c.kernel[...] for c in convs], axis=1)
            bias = jnp.concatenate([c.bias[...] for c in convs]) if cfg.conv_bias else None
            qkv, tail = short_conv(jnp.concatenate([q, k, v], -1), kernel, None if state is None else state.conv,
                                   bias, silu=True)
            q, k, v = jnp.split(qkv, [q.shape[-1], q.shape[-1] + k.shape[-1]], axis=-1)
        projection = self.features[...] if cfg.feature_map == "performer" else None
        # queries stabilised (Performer's max per token), which the normaliser the row requires divides out
        q, k = (feature_map(cfg.feature_map, y.reshape(B, T, cfg.groups, self.d_key), cfg.dpfp_nu, projection,
                            stabilise) for y, stabilise in ((q, True), (k, False)))
        v = v.reshape(B, T, H, self.d_value)
        if cfg.qk_norm == "l2":
            q, k = l2_normalize(q), l2_normalize(k)
        elif cfg.qk_norm == "rms":
            q, k = (rms_norm(y, n.scale[...], n.epsilon) for y, n in ((q, self.q_norm), (k, self.k_norm)))
        if cfg.groups not in (1, H):  # each group's q and k to its heads, in contiguous blocks as in Mamba-2
            q, k = (jnp.repeat(y, H // cfg.groups, axis=2) for y in (q, k))
        # one group stays [B, T, 1, d_phi]: the memory broadcasts it over the heads (tmem.memory.linear_state)
        q = q * (cfg.q_scale if cfg.q_scale is not None else self.d_phi ** -0.5)
        for name, y in (("keys", k), ("queries", q)):  # as written and read [B, T, H, d_phi]; for the probes
            self.sow(nnx.Intermediate, name, jnp.broadcast_to(y, (B, T, H, self.d_phi)), capture_noop=True)
        values = jnp.concatenate([v, jnp.ones((B, T, H, 1), v.dtype)], -1) if cfg.normalize else v
        log_a, beta = self.decay_and_strength(p)
        self.sow(nnx.Intermediate, "writes", (v, jnp.zeros((B, T, H, 1)) if log_a is None else
                                              jnp.broadcast_to(log_a, (B,) + log_a.shape[1:]),
                                              jnp.ones((B, T, H)) if beta is None else beta), capture_noop=True)
        kwargs = dict(log_a=log_a, beta=beta, delta=cfg.rule == "delta", state=None if state is None else state.memory)
        if cfg.run.form == "chunked":  # reads only at read_at
            o, memory = chunked(q, k, values, chunk=cfg.run.chunk, sub_chunk=cfg.run.sub_chunk, read_at=read_at,
                                **kwargs)
        else:
            o, memory = recurrent(q, k, values, **kwargs)
            o = at_positions(o, read_at)
        self.sow(nnx.Intermediate, "state", memory, capture_noop=True)
        if cfg.normalize:
            o = o[..., :-1] / (o[..., -1:] + NORMALISER_EPS)
        if cfg.skip:
            o = o + self.D[...][None, None, :, None] * at_positions(v, read_at)
        gate = None
        if cfg.output_gate:
            gate = GATE_ACTIVATIONS[cfg.gate_activation](at_positions(p["gate"], read_at)).reshape(o.shape)
            if cfg.gate_before_norm:
                o = o * gate
        if cfg.output_norm:  # nnx.RMSNorm's math (its scale, its epsilon), written out: see rms_norm
            o = self.output_norm(o)
        if gate is not None and not cfg.gate_before_norm:
            o = o * gate
        o = mask_heads(o, head_mask)
        length = T + (0 if state is None else state.length)
        return self.out(o.reshape(B, -1, H * self.d_value)), FastWeightState(memory, tail, length=length)
