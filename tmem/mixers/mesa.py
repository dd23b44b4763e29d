"""The mesa row (MesaNet): the optimiser "solve" of the test-time-regression table.

Each head keeps two gated sums, H_t = sum_i gamma_i^(t) k_i k_i^T and
G_t = sum_i gamma_i^(t) v_i k_i^T, and reads the ridge regression of the
values on the keys, o_t = G_t (H_t + Lambda)^{-1} q_t, at every token
(tmem/memory/mesa.py). The layer around it is MesaNet's as fla writes it
(anchors/mixers.md 4.3): q, k, v projections without bias; a short causal
convolution with SiLU on q and k (not v); unit (L2-normalised) q and k, no q
scale; forget gate a_t = sigmoid(W_a x + b_a) and input gate
beta_t = sigmoid(W_b x + b_b), one per head (`write_strength=one`: beta_t = 1,
as the grid's exact cells whose weights do not come from the token have it);
Lambda = softplus(p) + 0.25 per head and key channel, started at 1 and never
decayed; an RMSNorm of each head's read (optionally gated) and the output map.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
import math

import jax
import jax.numpy as jnp
from flax import nnx, struct

from tmem.layers import ShortConv, l2_normalize, short_conv
from tmem.memory import mesa
from tmem.memory.linear_state import retnet_log_decay
from tmem.mixers import flops as count
from tmem.mixers.base import (FORGET_OF_WEIGHTS, GATE_ACTIVATIONS, Cell, Mixer, MixerConfig, MixerState, Recipe, Run,
                              at_positions, check_knobs, mask_heads, recommended, resumable, run_field)

FORMS = ("auto", "parallel", "chunked", "recurrent")
# auto's switch: from this many tokens the chunked form, whose memory holds one H per chunk; below it the parallel
# form's H_t at every token are small and its solve is a single matrix product per CG step (faster on a CPU)
CHUNKED_FROM = 512
# ... unless a head's keys are this narrow or narrower: then H_t (d_k^2 floats a token) costs no more memory than
# the chunked form's scores, and the parallel form stays the quicker at any length (BENCHMARKS.md, "Long sequences":
# at d_k = 16, 8,192 tokens, 1.06 times the chunked form's peak in half its step; at d_k = 32, 1.5 times, and
# slower from 2,048 tokens)
PARALLEL_KEY_WIDTH = 16
FORGETS = ("gate", "fixed", "none")
WRITE_STRENGTHS = ("sigmoid", "one")
MESANET_CG_STEPS = 30  # MesaNet's training solves (fla's max_cg_step_training): the cap of the default steps


@dataclasses.dataclass(frozen=True)
class MesaRun(Run):
    # auto (by the task's length and the key width) | parallel (all H_t at once, T solves side by side) | chunked
    # (MesaNet's chunked CG: one H per chunk, memory bounded at long T) | recurrent (the definition)
    form: str = "auto"
    chunk: int = 64  # tokens per chunk of the sums; a sequence that fits in one is the masked quadratic form


@dataclasses.dataclass(frozen=True)
class MesaConfig(MixerConfig):
    name: str = "mesa"
    recipe: Recipe = recommended(lr=1e-2)
    heads: int = 4
    run: MesaRun = run_field(MesaRun)
    solver: str = "cg"  # the parallel form's: cg (MesaNet's, `steps` iterations) | cholesky (exact)
    # null: d_k (the head's key width), at most MesaNet's 30 (fla's max_cg_step_training), made concrete by `fit`.
    # CG solves d_k unknowns in d_k steps in exact arithmetic; the steps after that only chase float32's rounding
    # (against the exact solve at d_k = 16, 32 and 64 with every gate open, outputs and gradients agree to 1.6e-6 at
    # d_k steps as at 30). Resumable: the same function, so a run saved at MesaNet's 30 resumes at today's default
    cg_steps: int | None = resumable(None)
    short_conv: int = 4  # kernel of the causal convolution (with SiLU) on q and k; 0 for none
    lambda_floor: float = 0.25  # Lambda = softplus(p) + lambda_floor > lambda_floor: the system stays well posed
    lambda_init: float = 1.0
    # the regression weights gamma: gate (MesaNet's a_t from the token) | fixed (RetNet's decay per head) | none
    # (uniform: every pair counts alike, the regression of the whole prefix)
    forget: str = "gate"
    # beta_t, a factor of each pair's weight: sigmoid (MesaNet's, of a projection of the token) | one (no write
    # projection: the pairs weigh what `forget` says, so forget=none is the plain ridge regression of the prefix)
    write_strength: str = "sigmoid"
    output_gate: bool = False  # RMSNorm(o) * act(W_g x), fla's use_output_gate
    gate_activation: str = "silu"

    def check(self, width: int) -> None:
        check_knobs(self, choices={"run.form": FORMS, "solver": mesa.SOLVERS,
                                   "gate_activation": tuple(GATE_ACTIVATIONS), "forget": FORGETS,
                                   "write_strength": WRITE_STRENGTHS}, positive=("cg_steps", "run.chunk"),
                   width=width)
        if self.run.form == "chunked" and self.solver != "cg":
            raise ValueError(f"mixer.solver={self.solver} needs every H_t, which mixer.run.form=chunked never makes: "
                             "use mixer.solver=cg or mixer.run.form=parallel")
        if self.lambda_floor <= 0:
            raise ValueError(f"mixer.lambda_floor={self.lambda_floor} must be positive: it keeps the solve posed")
        if self.lambda_init <= self.lambda_floor:
            raise ValueError(f"mixer.lambda_init={self.lambda_init} must exceed mixer.lambda_floor={self.lambda_floor}")

    def steps(self, width: int) -> int:
        """The conjugate-gradient steps each solve takes: cg_steps, or by default d_k, at most MesaNet's 30."""
        return self.cg_steps or min(width // self.heads, MESANET_CG_STEPS)

    def fit(self, task, width: int) -> MesaConfig:
        """auto's form for the task's length and the key width, and the default CG steps for the key width."""
        fitted = dataclasses.replace(self, cg_steps=self.steps(width))
        return fitted if self.run.form != "auto" else fitted.with_run(form=training_form(self, task.seq_len, width))

    def state_size(self, width: int, seq_len: int) -> int:
        """H (d_k x d_k) and G (d_k x d_v) per head, and the convolutions' window on q and k."""
        d = width // self.heads
        return self.heads * 2 * d * d + max(self.short_conv - 1, 0) * 2 * width

    def cell(self) -> Cell:
        weights = next(w for w, forget in FORGET_OF_WEIGHTS.items() if forget == self.forget)
        return weights, "linear", "exact", "zero"

    def at_cell(self, cell: Cell, mini_batch: int, heads: int, write_strength: str | None = None
                ) -> MesaConfig | None:
        """Every exact cell of a linear memory: the solve, with the cell's weights as its forgetting."""
        if cell[1:] != ("linear", "exact", "zero"):
            return None
        strength = {None: self.write_strength, "learned": "sigmoid", "none": "one"}[write_strength]
        return dataclasses.replace(self, forget=FORGET_OF_WEIGHTS[cell[0]], heads=heads, write_strength=strength)

    def flops(self, model, B: int, T: int, Q: int | None, input_grad: bool, once: bool = False) -> Counter:
        """Q, k, v and the gates' maps, the short convolution on q and k, unit q and k, the ridge systems
        (H_t + Lambda) x = q solved by conjugate gradients (the parallel form: H_t made and a system solved where
        the layer reads; the chunked form: every token's system, its products from the chunk's entry state
        and keys), G read with the solutions as queries (the chunked form of the sums), each head's RMSNorm, the
        gate and the output map."""
        c, D = self, model.width
        count.training_form(c, "parallel", "chunked")
        if c.solver != "cg":  # a LAPACK call, which XLA's cost analysis counts as nothing
            raise count.Uncounted(f"mixer {c.name!r} has no FLOP count with solver={c.solver}")
        H, d, N, R = c.heads, D // c.heads, B * T, B * (Q or T)
        gated, written = c.forget == "gate", c.write_strength == "sigmoid"
        grads = 2 if input_grad else 1
        parts = Counter()
        parts["mixer/projections"] += 3 * count.matmul(N, D, D, grads) + count.matmul(R, D, D)
        # the gates', with biases
        parts["mixer/projections"] += (written + gated) * (count.matmul(N, D, H, grads) + 2 * N * H)
        if c.short_conv:
            parts["mixer/conv"] += count.short_conv(B, T, 2 * D, c.short_conv)
        gates = count.elementwise(2 * N * D, count.L2_NORMALIZE) + written * count.elementwise(N * H, count.SIGMOID)
        if gated:
            gates += count.elementwise(N * H, count.LOG_SIGMOID)
        if c.output_gate:  # made at every token and read at R (reading at Q, its gradient scattered back)
            activation = count.SILU if c.gate_activation == "silu" else count.SIGMOID
            parts["mixer/projections"] += count.matmul(N, D, D, grads)
            gates += count.elementwise(R * D, activation) + 3 * R * D + (R * D if Q else 0)
        parts["mixer/gates"] += gates
        parts["norms"] += count.norm("rmsnorm", R * D)
        reads = B * H * (Q or T)  # the systems solved: one for each read of each head
        if c.run.form == "chunked":  # every token's system, each product from its chunk's entry state and keys
            memory = count.chunked_cg(B * H, T, d, c.run.chunk, gated, written, c.steps(D), Q is not None, once)
        else:
            # H_t made at the reads alone when they are fewer than a chunk's tokens (tmem.memory.mesa.parallel)
            at_reads = Q is not None and Q < min(c.run.chunk, T)
            memory = count.sums_and_solves(B * H, T, d, c.run.chunk, gated, written, c.steps(D),
                                           reads if at_reads else None, Q is not None and not at_reads, once)
        memory += count.chunked(B * H, T, d, d, 1, gated, written, False, c.run.chunk, None if Q is None else reads,
                                once)
        parts["mixer/memory"] += memory
        return parts


def training_form(cfg: MesaConfig, seq_len: int, width: int) -> str:
    """The form `auto` takes for sequences of seq_len tokens in a model this wide: chunked from CHUNKED_FROM tokens
    where the heads' keys are wider than PARALLEL_KEY_WIDTH, else parallel (the exact solve needs every H_t)."""
    long = seq_len >= CHUNKED_FROM and width // cfg.heads > PARALLEL_KEY_WIDTH
    return "chunked" if long and cfg.solver == "cg" else "parallel"


@struct.dataclass
class MesaState(MixerState):
    """The sums H [B, H, d_k, d_k] and G [B, H, d_k, d_v], and the convolutions' last inputs."""

    H: jax.Array
    G: jax.Array
    conv: jax.Array | None  # [B, K-1, q and k channels side by side]

    def matrix(self, layer: Mesa) -> jax.Array:
        """G, the gated sum of k v^T (H, the keys' second moment, only whitens the query)."""
        return self.G

    def read_matrix(self, layer: Mesa) -> jax.Array:
        """(H + Lambda)^-1 G: the ridge solution the read applies to a query."""
        return mesa.solve_sums(self.H, self.G, layer.lam())


class Mesa(Mixer):
    """A mesa layer: write every token into H and G, read the ridge solution with the queries.

    The final sums are sown as the `state` intermediate, the unit keys written into them as `keys`, and their
    values, log forget gates and write strengths as `writes`.
    """

    sows = frozenset({"state", "keys", "writes"})

    def __init__(self, cfg: MesaConfig, width: int, *, rope: bool, rngs: nnx.Rngs):
        del rope  # positions come from the convolution and the forget gate
        self.cfg = cfg
        H, self.d = cfg.heads, width // cfg.heads
        linear = lambda n_out, bias=False: nnx.Linear(width, n_out, use_bias=bias, rngs=rngs)  # noqa: E731
        self.q, self.k, self.v = linear(width), linear(width), linear(width)
        if cfg.forget == "gate":
            self.forget = linear(H, bias=True)  # fla's a_proj
        if cfg.write_strength == "sigmoid":
            self.write = linear(H, bias=True)  # fla's b_proj
        if cfg.short_conv:
            self.conv_q, self.conv_k = (ShortConv(width, cfg.short_conv, rngs=rngs) for _ in range(2))
        p = math.log(math.expm1(cfg.lambda_init - cfg.lambda_floor))  # softplus(p) + floor = lambda_init
        self.lambda_param = nnx.Param(jnp.full((H, self.d), p))
        self.norm = nnx.RMSNorm(self.d, epsilon=1e-5, rngs=rngs)
        if cfg.output_gate:
            self.gate = linear(width)
        self.out = linear(width)

    def lam(self) -> jax.Array:
        """Lambda [H, d_k], the ridge on the diagonal, above its floor."""
        return jax.nn.softplus(self.lambda_param[...]) + self.cfg.lambda_floor

    def __call__(self, x_btd, *, state: MesaState | None = None, head_mask=None, read_at=None, qk_positions=None):
        """The protocol's call (tmem.mixers.base.Mixer)."""
        del qk_positions  # validation gives it only to rows that take it
        cfg, (B, T, D), H = self.cfg, x_btd.shape, self.cfg.heads
        q, k, v = self.q(x_btd), self.k(x_btd), self.v(x_btd)
        tail = None
        if cfg.short_conv:  # the two filters as one, over q and k side by side
            kernel = jnp.concatenate([self.conv_q.kernel[...], self.conv_k.kernel[...]], axis=1)
            qk, tail = short_conv(jnp.concatenate([q, k], -1), kernel, None if state is None else state.conv,
                                  silu=True)
            q, k = jnp.split(qk, 2, axis=-1)
        q, k = (l2_normalize(y.reshape(B, T, H, self.d)) for y in (q, k))
        self.sow(nnx.Intermediate, "keys", k, capture_noop=True)  # the unit keys written into H and G
        v = v.reshape(B, T, H, self.d)
        log_a = jnp.zeros((B, T, H))
        if cfg.forget == "gate":
            log_a = jax.nn.log_sigmoid(self.forget(x_btd))
        elif cfg.forget == "fixed":
            log_a = jnp.broadcast_to(retnet_log_decay(H), (B, T, H))
        beta = jax.nn.sigmoid(self.write(x_btd)) if cfg.write_strength == "sigmoid" else jnp.ones((B, T, H))
        lam = self.lam()
        self.sow(nnx.Intermediate, "writes", (v, log_a[..., None], beta), capture_noop=True)
        kwargs = dict(log_a=log_a, beta=beta, lam=lam, state=None if state is None else (state.H, state.G))
        form = training_form(cfg, T, D) if cfg.run.form == "auto" else cfg.run.form  # a layer made without validation
        if form == "chunked":
            o, (Hs, Gs) = mesa.chunked_cg(q, k, v, cg_steps=cfg.steps(D), chunk=cfg.run.chunk, read_at=read_at,
                                          **kwargs)
        elif form == "parallel":
            o, (Hs, Gs) = mesa.parallel(q, k, v, solver=cfg.solver, cg_steps=cfg.steps(D), chunk=cfg.run.chunk,
                                        read_at=read_at, **kwargs)
        else:
            o, (Hs, Gs) = mesa.recurrent(q, k, v, **kwargs)
            o = at_positions(o, read_at)
        self.sow(nnx.Intermediate, "state", (Hs, Gs), capture_noop=True)
        o = self.norm(o)
        if cfg.output_gate:
            o = o * GATE_ACTIVATIONS[cfg.gate_activation](at_positions(self.gate(x_btd), read_at)).reshape(o.shape)
        o = mask_heads(o, head_mask)
        length = T + (0 if state is None else state.length)
        return self.out(o.reshape(B, -1, D)), MesaState(Hs, Gs, tail, length=length)
