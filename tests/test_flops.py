"""The analytic FLOP count of a training step (tmem.flops) against XLA's cost analysis of the lowered step."""

import importlib
from functools import lru_cache, partial

import jax
import jax.numpy as jnp
import pytest

from conftest import ROOT, compose_config, quick_only
from tmem.config import validate
from tmem.flops import step_flops
from tmem.memory.chunked import one_reference_scores
from tmem.memory.features import feature_map, performer
from tmem.memory.flops import gradient_step, state_pass, token_step, ttt_step
from tmem.memory.flops_mesa import cg_step
from tmem.memory.linear_state import recurrent, retnet_log_decay
from tmem.mixers import MIXERS
from tmem.mixers.fast_weight import FastWeightConfig
from tmem.mixers.base import MixerConfig
from tmem.mixers.flops import Uncounted, feature_map_cost, feature_maps
from tmem.mixers.titans import TitansConfig
from tmem.train.build import build
from tmem.train.step import make_train_step

chunked_module = importlib.import_module("tmem.memory.chunked")  # tmem.memory's `chunked` is the function

# a mixer YAML that names no row of its own (regression: a cell of a grid, resolved to a row's config when
# validated) is counted as that row
ROWS = sorted(p.stem for p in (ROOT / "configs" / "mixer").glob("*.yaml") if p.stem in MIXERS)
FAST_WEIGHT = {row for row in ROWS if MIXERS[row].config is FastWeightConfig}
# the quick subset counts a fast-weight row here (linear attention: the quickest to compile, 7 s for gated DeltaNet
# from an empty cache) and softmax with every option below; the full suite every row
QUICK = {"linear"}

# XLA's count of the lowered step has each operation once, as the analytic count does; on the loop-free default
# job the analytic total is 0.25 to 2% below it (rwkv7 0.25%, softmax 0.3%, mesa 0.3%, linear 0.4%: a sum of n
# numbers is n - 1 additions here, n there, and the loops' counters; ttt_mlp 0.5%, titans 2.2%, its short
# convolution counted twice, as test_xla_counts_the_loops_of_the_memories_once says); the compiled program's count
# is 1 to 3% above that again, a cheap producer counted in every fusion that reads it. 5% leaves room for
# another XLA version, and is far below the factor of 2 (or of the number of chunks) that a loop's body counted
# once makes.
TOLERANCE = 0.05


def config(*overrides):
    return validate(compose_config(["logger=disabled", *overrides]))


@lru_cache(maxsize=None)
def xla_flops(*overrides) -> float:
    """XLA's count for the train step as benchmarks/mqar_speed.py compiles it, less that of sampling the batch.

    jax.jit turns down LLVM's optimisation only, which compiles several times faster: the HLO XLA counts is
    the same. The sampler (threefry, the task's draws) is left out of the analytic count, so its own count, compiled
    alone, is taken off: about 1.1 MFLOP for 64 MQAR examples, 0.1% of a step but 4% of mixer=none's.
    """
    cfg = config(*overrides)
    t = cfg.train
    graphdef, state, tx, schedule = build(cfg)
    step = jax.jit(make_train_step(graphdef, cfg.task, tx, t.batch_size, schedule, t.microbatch), donate_argnums=0)
    slice_size = min(t.microbatch or t.batch_size, t.batch_size)
    sample = jax.jit(lambda key: cfg.task.sample(key, slice_size))
    with pytest.MonkeyPatch.context() as patch:  # XLA counts a conditional at its costlier branch: see one_form
        patch.setattr(chunked_module, "_vector_forms", one_form)
        return flops_of(step.lower(state)) - flops_of(sample.lower(jax.random.key(0)))


def one_form(sub_chunk, precision):
    """A vector decay's scores as the step computes them while the decays fit (all through training here), as
    both branches of the conditional between its forms: the other, sub-chunks, is counted by XLA but not run."""
    return (partial(one_reference_scores, precision=precision),) * 2


def flops_of(lowered, compiled: bool = False) -> float:
    """XLA's cost analysis of the lowered program, before its optimisation passes: the same count of the same
    operations, each once (the compiled program counts a cheap producer again in every fusion that reads it, 1 to
    3% more), and no compile, which would be most of this file's time. `compiled`: the compiled program's, whose
    fusions' copies the token step's and the feature maps' tests count (small programs, quick to compile)."""
    cost = (lowered.compile() if compiled else lowered).cost_analysis()
    return (cost[0] if isinstance(cost, list) else cost)["flops"]


# what else each row needs to run without a loop: one mini-batch of all T = 64 tokens (TTT-Linear), and one
# conjugate-gradient step (mesa: XLA drops a loop that runs once; its sums are in one chunk already). The
# gradient memory (TTT-MLP, Titans) runs its 4 mini-batches without a loop (gradient.UNROLLED)
LOOP_FREE = {"mesa": ("mixer.cg_steps=1",), "ttt_linear": ("mixer.mini_batch=64",)}


def loop_free(row: str) -> tuple[str, ...]:
    """The default MQAR job with `row`, without loops: no microbatches, one chunk of T = 64 tokens, and as
    LOOP_FREE says."""
    chunk = ["mixer.run.chunk=64"] if row in FAST_WEIGHT else []
    return (f"mixer={row}", "train.microbatch=null", *chunk, *LOOP_FREE.get(row, ()))


# rows that train in a scan over the tokens (Mamba-1): their job is loop-free but for it, and XLA counts its step once
TOKEN_SCAN = {"mamba"}


@pytest.mark.parametrize("row", quick_only(ROWS, QUICK))
def test_the_count_of_a_loop_free_step_matches_xla(row):
    cfg = config(*loop_free(row))
    analytic, xla = step_flops(cfg, loop_bodies_once=row in TOKEN_SCAN)["total"], xla_flops(*loop_free(row))
    assert analytic == pytest.approx(xla, rel=TOLERANCE), f"{row}: analytic {analytic:.4g}, XLA {xla:.4g}"


def test_every_row_is_counted_and_a_row_without_a_count_is_refused(monkeypatch):
    """Every row's config counts itself; a new row whose config has no `flops` is refused, never counted as zero."""
    assert all(row.config.flops is not MixerConfig.flops for row in MIXERS.values())
    monkeypatch.delattr(TitansConfig, "flops")
    with pytest.raises(Uncounted, match="mixer 'titans' has no FLOP count: give TitansConfig a `flops` method"):
        step_flops(config("mixer=titans"))


# forms no count covers: the definitions the training forms are tested against (token loops), mesa's exact
# solve, a LAPACK call that XLA's cost analysis counts as nothing, Mamba's associative scan, whose count by XLA grows
# as T log T (its fusions recompute the scan's rounds), and MLA's absorbed read, its decoding form
UNCOUNTED_FORMS = [("mesa", "run.form=recurrent"), ("mesa", "solver=cholesky"),
                   ("ttt_mlp", "run.form=recurrent"), ("titans", "run.form=recurrent"), ("mamba", "run.form=parallel"),
                   ("rwkv7", "run.form=recurrent"), ("mla", "run.form=absorbed")]


@pytest.mark.slow  # cheap, but the quick subset has its refusal above
@pytest.mark.parametrize("row,form", UNCOUNTED_FORMS, ids=[f"{r} {f}" for r, f in UNCOUNTED_FORMS])
def test_a_form_without_a_count_is_refused_not_counted_as_zero(row, form):
    with pytest.raises(Uncounted, match=f"mixer '{row}' has no FLOP count with {form}"):
        step_flops(config(f"mixer={row}", f"mixer.{form}"))


# the options of mixer=softmax and post-norm, in two sets that together hold every option once
OPTION_SETS = {
    "gqa-window-sinks-gate-ssmax-l2-post": ("mixer.kv_heads=2", "mixer.window=16", "mixer.sinks=true",
                                            "mixer.output_gate=true", "mixer.gate_activation=silu",
                                            "mixer.length_scale=ssmax", "mixer.qk_norm=l2",
                                            "model.norm_position=post", "mlp=relu"),
    "mqa-logn-rms": ("mixer.kv_heads=1", "mixer.length_scale=logn", "mixer.qk_norm=rms"),
}


@pytest.mark.parametrize("options", quick_only([pytest.param(o, id=name) for name, o in OPTION_SETS.items()],
                                               {"gqa-window-sinks-gate-ssmax-l2-post"}))
def test_the_count_of_the_softmax_options_matches_xla(options):
    overrides = (*loop_free("softmax"), *options)
    analytic, xla = step_flops(config(*overrides))["total"], xla_flops(*overrides)
    assert analytic == pytest.approx(xla, rel=TOLERANCE), f"{options}: analytic {analytic:.4g}, XLA {xla:.4g}"


# the hopfield row's unrolled updates and learned beta; Mamba-2's layer before its reference (per-head B and C, no
# conv bias, per-head norm, gate after it); the mesa layer as the grid's uniform exact cell (no gate trains: XLA
# folds the constant mask they leave), and in its chunked CG form over two chunks (the state entering the second;
# analytic / XLA 1.007, and 0.995 in one chunk)
ROW_OPTIONS = [("hopfield", "mixer.iterations=3", "mixer.learn_temperature=true"),
               ("mamba2", "mixer.qk_groups=null", "mixer.conv_bias=false", "mixer.output_norm_over=head",
                "mixer.gate_before_norm=false"),
               ("mesa", "mixer.forget=none", "mixer.write_strength=one"),
               ("mesa", "mixer.run.form=chunked", "mixer.run.chunk=32")]


@pytest.mark.slow
@pytest.mark.parametrize("options", ROW_OPTIONS, ids=lambda o: " ".join(o))
def test_the_count_of_the_hopfield_mamba2_and_mesa_options_matches_xla(options):
    overrides = (*loop_free(options[0]), *options[1:])
    analytic, xla = step_flops(config(*overrides))["total"], xla_flops(*overrides)
    assert analytic == pytest.approx(xla, rel=TOLERANCE), f"{options}: analytic {analytic:.4g}, XLA {xla:.4g}"


@pytest.mark.slow  # 10 s: a fact about XLA's count, not a count of ours; the full suite keeps it
def test_xla_counts_the_microbatch_loop_once():
    """The default job's 64 examples differentiated in a lax.map over 2 slices of 32: XLA counts one slice."""
    cfg = config("train.microbatch=32")
    assert cfg.train.batch_size // cfg.train.microbatch == 2
    xla = xla_flops("train.microbatch=32")
    assert step_flops(cfg)["total"] == pytest.approx(2 * xla, rel=TOLERANCE)
    assert step_flops(cfg, loop_bodies_once=True)["total"] == pytest.approx(xla, rel=TOLERANCE)


@pytest.mark.slow  # 13 s: a fact about XLA's count, not a count of ours; the full suite keeps it
def test_xla_counts_the_scan_over_chunks_once():
    """DeltaNet in chunks of 32 passes its state through a scan of 2 steps, whose body XLA counts once."""
    overrides = ("mixer=deltanet", "train.microbatch=null", "mixer.run.chunk=32")
    cfg, xla = config(*overrides), xla_flops(*overrides)
    unrolled, once = step_flops(cfg)["total"], step_flops(cfg, loop_bodies_once=True)["total"]
    assert once == pytest.approx(xla, rel=TOLERANCE)
    # the second step in each of the 2 layers: u - w S and k^T u for 64 examples x H heads of d_k = d_v = 64 / H
    H = cfg.mixer.heads
    assert unrolled - once == 2 * state_pass(64 * H, 32, 64 // H, 64 // H, decay=None, delta=True)


# The rows whose job has a loop besides the microbatches': mesa's 16 conjugate-gradient steps, each solve's
# forward and backward a scan; TTT's scan over the mini-batches after the first (3 of the 4 of 16 tokens), and
# the gradient memory's over all but the first and last of more than gradient.UNROLLED (6 of 8 at T = 128). In
# each of the 2 layers, for 64 examples x 4 heads of d = 16 (TTT-MLP's hidden 64; Titans' two heads of 32,
# hidden 128), what the unrolled count has more than XLA's is the rest of each loop's steps: mesa's at the 64
# positions of the first layer and the 4 reads of the last, the gradient memory's reading every token in the
# first layer and the 4 positions in the last. The default job but for the row's own overrides.
LOOP_BODIES = {
    "mesa": ((), lambda: 2 * 15 * 64 * 4 * (64 + 4) * (cg_step(16) + 2 * 16)),  # each solve's 16 steps both ways
    "ttt_linear": ((), lambda: 2 * 2 * ttt_step(64 * 4, 16, 16)),
    "ttt_mlp": (("task.seq_len=128",), lambda: 64 * 4 * 5 * sum(
        gradient_step(16, [16, 64, 16], True, True, True, False, False, queries=Q) for Q in (None, 4))),
    "titans": (("task.seq_len=128",), lambda: 64 * 2 * 5 * sum(
        gradient_step(16, [32, 128, 32], True, True, False, True, True, queries=Q) for Q in (None, 4))),
}


@pytest.mark.slow  # 3 to 6 s each: the default jobs' programs
@pytest.mark.parametrize("row", sorted(LOOP_BODIES))
def test_xla_counts_the_loops_of_the_memories_once(row):
    """XLA's count of the job in one microbatch is the count with each loop's body once; unrolled, the count has
    the other steps. Analytic / XLA is mesa 0.983, ttt_linear 0.978, ttt_mlp 0.984 and titans 0.981 (0.966 at
    four heads): Titans' short convolution over q, k and v, which XLA fuses into the many fusions of the memory
    that read them and counts twice (at four heads 2.04 times the analytic count, 1.8% of the step)."""
    extra, loop_bodies = LOOP_BODIES[row]
    overrides = (f"mixer={row}", "train.microbatch=null", *extra)
    cfg, xla = config(*overrides), xla_flops(*overrides)
    unrolled, once = step_flops(cfg)["total"], step_flops(cfg, loop_bodies_once=True)["total"]
    assert once == pytest.approx(xla, rel=TOLERANCE), f"{row}: analytic {once:.4g}, XLA {xla:.4g}"
    assert unrolled - once == loop_bodies()


# The recurrent form (mixer.run.form=recurrent) is a scan over the tokens, whose step XLA counts once: GLA's has the add
# rule and a vector decay, Gated DeltaNet's the delta rule, a scalar decay and a write strength. With the step
# counted once it is under 0.5% of the program, so these check the layer around it: analytic / XLA is gla 0.980,
# gated_deltanet 0.979, the gap the loop-free steps' (the SiLU after the short convolution fused into each of its
# consumers, and the like). The step itself is checked alone below.
RECURRENT = ("gla", "gated_deltanet")


def recurrent_job(row: str) -> tuple[str, ...]:
    """The default MQAR job with `row` in its recurrent form, in one microbatch (the scan the only loop)."""
    return (f"mixer={row}", "mixer.run.form=recurrent", "train.microbatch=null")


@pytest.mark.slow
@pytest.mark.parametrize("row", ["gated_deltanet"])  # GLA's vector decay is checked in the step alone, below
def test_xla_counts_the_scan_over_tokens_once(row):
    analytic = step_flops(config(*recurrent_job(row)), loop_bodies_once=True)["total"]
    xla = xla_flops(*recurrent_job(row))
    assert analytic == pytest.approx(xla, rel=TOLERANCE), f"{row}: analytic {analytic:.4g}, XLA {xla:.4g}"


@pytest.mark.parametrize("row", RECURRENT)
def test_the_recurrent_form_counts_its_step_at_every_token(row):
    """The step runs at each of the T = 64 tokens: 63 more times than XLA counts it, in each of the 2 layers, for
    64 examples x H heads of d_k = d_v = 64 / H."""
    cfg = config(*recurrent_job(row))
    c = cfg.mixer
    d = 64 // c.heads
    step = token_step(64 * c.heads, d, d, {"scalar": 1, "vector": d}[c.decay], True, c.write_strength != "one",
                      c.rule == "delta")
    unrolled, once = step_flops(cfg)["total"], step_flops(cfg, loop_bodies_once=True)["total"]
    assert unrolled - once == 2 * 63 * step


def xla_step_copies(E: int, delta: bool, decay: bool, decay_grad: bool, strengths: bool) -> int:
    """FLOPs that XLA's CPU fusion of the recurrent step computes more than once, and counts each time, where
    token_step counts each op once; E is one FLOP for every element of the state.

    Add rule: the backward's dS + q do^T (a product and an add) is recomputed inside each fusion that reads it (the
    gradient carried back, the keys', the values', and beta's and the decay's where they train), and beta times
    it inside both the keys' and the values'; with a strength the forward makes k v^T twice, for the write and
    saved for beta's gradient. Delta rule: with a decay the forward makes a S three times (for S'^T k, for the
    write, and saved for the backward), and the decay's gradient recomputes dS - k de^T.
    """
    if delta:
        return 2 * E * (decay + decay_grad)
    return 2 * E * (2 + strengths + decay_grad) + E + E * strengths


# (rule, decay, write strength): the recurrent steps of the six fast-weight rows, and the delta rule with a vector
# decay, which no row has
TOKEN_STEPS = [("add", "none", False), ("add", "fixed", False), ("add", "vector", False), ("add", "scalar", True),
               ("delta", "none", True), ("delta", "scalar", True), ("delta", "vector", False)]


@pytest.mark.parametrize("rule,decay,strength", TOKEN_STEPS, ids=["-".join(map(str, s)) for s in TOKEN_STEPS])
def test_the_count_of_a_recurrent_step_matches_xla(rule, decay, strength):
    """tmem.memory.linear_state.recurrent alone, its read and the read's vjp (nothing outside the scan to
    count): XLA counts the scan's forward and backward steps once each, token_step and XLA's copies above.

    Without the copies analytic / XLA is 0.67 to 0.75 for the add rule; for the delta rule 1.0, and 0.85 to 0.91
    with a decay.
    1% leaves room for XLA counting a sum of n numbers as n - 1 additions, and for the loops' counters.
    """
    B, T, H, d = 1, 4, 2, 32
    G = {"none": None, "fixed": 1, "scalar": 1, "vector": d}[decay]
    trained = decay in ("scalar", "vector")
    shapes = {"q": (B, T, H, d), "k": (B, T, H, d), "v": (B, T, H, d)}
    if trained:
        shapes["log_a"] = (B, T, H, G)
    if strength:
        shapes["beta"] = (B, T, H)
    # RetNet's decay is a constant of the program, as in the layer: nothing to differentiate
    fixed = {"log_a": jnp.broadcast_to(retnet_log_decay(H)[:, None], (B, T, H, 1))} if decay == "fixed" else {}

    def read_and_pull_back(inputs, do):
        o, pullback = jax.vjp(lambda inputs: recurrent(**inputs, **fixed, delta=rule == "delta")[0], inputs)
        return o, pullback(do)

    spec = lambda shape: jax.ShapeDtypeStruct(shape, jnp.float32)  # noqa: E731
    xla = flops_of(jax.jit(read_and_pull_back).lower({n: spec(s) for n, s in shapes.items()}, spec((B, T, H, d))),
                   compiled=True)
    analytic = token_step(B * H, d, d, G, trained, strength, rule == "delta")
    copies = xla_step_copies(B * H * d * d, rule == "delta", G is not None, trained, strength)
    assert analytic + copies == pytest.approx(xla, rel=0.01), f"analytic {analytic} + copies {copies}, XLA {xla}"


@pytest.mark.parametrize("name,nu,d", [("elu", 1, 16), ("relu", 1, 16), ("dpfp", 1, 16), ("dpfp", 3, 16),
                                       ("taylor", 1, 16), ("taylor", 1, 6)])
def test_the_feature_maps_cost_what_xla_counts(name, nu, d):
    """Per element into the map, as the constants were measured: the forward alone, then the forward and the
    backward (the map's vjp) less the forward. DPFP's grow by a constant with each shift, Taylor's with d."""
    x = jax.ShapeDtypeStruct((64, d), jnp.float32)
    phi = lambda x: feature_map(name, x, nu)  # noqa: E731
    g = jax.ShapeDtypeStruct(jax.eval_shape(phi, x).shape, jnp.float32)
    forward = flops_of(jax.jit(phi).lower(x), compiled=True)
    both = flops_of(jax.jit(lambda x, g: (phi(x), jax.vjp(phi, x)[1](g))).lower(x, g), compiled=True)
    assert (forward / x.size, (both - forward) / x.size) == feature_map_cost(name, nu, d)


@pytest.mark.parametrize("d,m", [(16, 64), (8, 128), (32, 128)])
def test_the_performer_map_costs_what_xla_counts(d, m):
    """q's map (stabilised) and k's (plain) over 64 tokens each, forward and backward, the projection fixed."""
    x, w = jax.ShapeDtypeStruct((64, d), jnp.float32), jax.ShapeDtypeStruct((d, m), jnp.float32)
    g = jax.ShapeDtypeStruct((64, m), jnp.float32)

    def both_maps(q, k, w, gq, gk):
        (phi_q, pull_q), (phi_k, pull_k) = (jax.vjp(lambda y: performer(y, w, stabilise=s), y)
                                            for y, s in ((q, True), (k, False)))
        return phi_q, phi_k, pull_q(gq), pull_k(gk)

    assert flops_of(jax.jit(both_maps).lower(x, x, w, g, g), compiled=True) == feature_maps("performer", 64, d, 1, m)


@pytest.mark.slow
def test_the_count_of_dpfp_matches_xla():
    """DPFP widens each head's d_k = 16 to d_phi = 2 nu d_k = 64 for nu = 2; the linear row with its normaliser
    (analytic / XLA 0.966; 0.968 for nu = 1)."""
    overrides = (*loop_free("linear"), "mixer.feature_map=dpfp", "mixer.dpfp_nu=2", "mixer.normalize=true",
                 "mixer.qk_norm=none")
    analytic, xla = step_flops(config(*overrides))["total"], xla_flops(*overrides)
    assert analytic == pytest.approx(xla, rel=TOLERANCE), f"analytic {analytic:.4g}, XLA {xla:.4g}"


@pytest.mark.slow
def test_the_count_of_performer_attention_matches_xla():
    """The linear row with 64 random features (d_phi = 64 from d_k = 32) and its normaliser."""
    overrides = ("mixer=performer", "train.microbatch=null", "mixer.run.chunk=64")
    analytic, xla = step_flops(config(*overrides))["total"], xla_flops(*overrides)
    assert analytic == pytest.approx(xla, rel=TOLERANCE), f"analytic {analytic:.4g}, XLA {xla:.4g}"


@pytest.mark.slow
def test_the_count_of_a_vector_task_matches_xla():
    overrides = ("task=linreg", "train.microbatch=null")
    assert step_flops(config(*overrides))["total"] == pytest.approx(xla_flops(*overrides), rel=TOLERANCE)


@pytest.mark.parametrize("row", quick_only(ROWS, {"softmax", "retnet"}))  # the quick subset: RetNet's shared decay
def test_everything_but_the_optimizer_doubles_with_the_batch(row):
    """RetNet's fixed decay is made once for the whole batch, and Mamba's A from its log: the parts that stay."""
    one, two = (step_flops(config(*loop_free(row), f"train.batch_size={b}")) for b in (64, 128))
    shared = 0
    if row == "retnet":  # for H heads of one chunk of 64: the cumulative log decay (a matmul with a triangle of
        # ones) in both layers, and b_i - b_j with its mask in the first (the last reads at a few positions)
        H = config(f"mixer={row}").mixer.heads
        shared = 2 * (2 * H * 64 * 64) + 2 * H * 64 * 64
        assert 0 < shared < 0.01 * one["mixer/memory"]
    if row == "mamba":  # A = -exp(A_log) and its gradient, once for the batch in each of the two layers
        mixer = config(f"mixer={row}").mixer
        shared = 2 * 3 * mixer.expand * 64 * mixer.d_state
    assert two["total"] - two["optimizer"] == 2 * (one["total"] - one["optimizer"]) - shared
    assert two["optimizer"] == one["optimizer"]


def test_projections_grow_with_the_width_squared_and_attention_with_the_length_squared():
    base = step_flops(config("train.microbatch=null"))
    wide = step_flops(config("train.microbatch=null", "model.width=128"))
    assert wide["mixer/projections"] == 4 * base["mixer/projections"]
    # every layer reads at every position (a task that scores all): scores and read grow as T^2
    full = [step_flops(config("task=repeat", f"task.seq_len={T}"))["mixer/memory"] for T in (64, 128)]
    assert full[1] == pytest.approx(4 * full[0], rel=0.01)


def test_microbatches_change_only_the_combination_of_their_gradients():
    whole, sliced = step_flops(config("train.microbatch=null")), step_flops(config())
    assert {k: v for k, v in whole.items() if k not in ("optimizer", "total")} == \
        {k: v for k, v in sliced.items() if k not in ("optimizer", "total")}
    assert sliced["optimizer"] > whole["optimizer"]


def test_every_part_is_named_and_the_total_is_their_sum():
    counts = step_flops(config("mixer=gla", "mlp=swiglu"))
    assert set(counts) == {"embed/unembed", "norms", "mixer/projections", "mixer/conv", "mixer/gates",
                           "mixer/memory", "mlp", "residual", "loss", "optimizer", "total"}
    assert counts["total"] == sum(v for k, v in counts.items() if k != "total")


# the MLPs beyond the dense default's none: the cubed ReLU, the mixture of experts (a gated score, biases and
# Switch's gates in the second set) and product-key memories (one head, then two reading fewer keys each)
MLP_OPTIONS = {"moe": ("mlp=moe",), "pkm": ("mlp=pkm",), "relu3": ("mlp=relu3",),
               "moe-swiglu-bias-switch": ("mlp=moe", "mlp.score=swiglu", "mlp.bias=true", "mlp.renormalize=false"),
               "pkm-heads": ("mlp=pkm", "mlp.heads=2", "mlp.top_k=4")}


@pytest.mark.slow  # 20 to 40 s each, the default job's program; the quick subset has the count's shape below
@pytest.mark.parametrize("options", MLP_OPTIONS.values(), ids=MLP_OPTIONS.keys())
def test_the_count_of_the_mlps_matches_xla(options):
    """Analytic / XLA 0.993 to 0.996 on the default job (the MLP's own share 0.993 to 1.000)."""
    overrides = (*loop_free("softmax"), *options)
    analytic, xla = step_flops(config(*overrides))["total"], xla_flops(*overrides)
    assert analytic == pytest.approx(xla, rel=TOLERANCE), f"{options}: analytic {analytic:.4g}, XLA {xla:.4g}"


def test_a_mixture_counts_its_active_experts():
    """Top 2 of 8 experts cost about a quarter of all 8 on every token (a dense MLP as wide as all of them): the
    router and the padding of each expert's rows to a block add the rest."""
    moe = step_flops(config("mlp=moe", "mlp.expansion=1"))["mlp"]
    every_expert = step_flops(config("mlp=relu", "mlp.expansion=8"))["mlp"]
    assert 0.25 < moe / every_expert < 0.3


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [("model.mixers=[{name:gated_deltanet,run:{chunk:64}},softmax]",),
                                       ("model=based",)],
                         ids=["gated_deltanet+softmax", "based"])
def test_the_count_of_a_hybrid_matches_xla(overrides):
    """Each layer counted as its row counts its own: Gated DeltaNet beside softmax, and Based (a softmax window
    beside linear attention with the Taylor map, d_phi = 273)."""
    overrides = ("train.microbatch=null", *overrides)
    analytic, xla = step_flops(config(*overrides))["total"], xla_flops(*overrides)
    assert analytic == pytest.approx(xla, rel=TOLERANCE), f"{overrides}: analytic {analytic:.4g}, XLA {xla:.4g}"
