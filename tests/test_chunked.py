"""The chunked form equals the recurrent definition: outputs, final state and gradients, fp32."""

from functools import partial

import jax
import jax.numpy as jnp
import pytest

from conftest import quick_only
from tmem.memory.chunked import (ONE_REFERENCE_SPAN, chunked, intra_scores, one_reference_scores,
                                 sub_chunk_scores, unit_lower_solve)
from tmem.memory.linear_state import recurrent
from tmem.memory.reads import at_positions

B, H, DK, DV = 2, 2, 4, 3
TOL = 1e-5
FULL = jax.lax.Precision.HIGHEST  # the oracle comparisons hold in full float32, not at a GPU's TF32 default


def rel_err(a, b):
    """Norm-wise relative error ||a - b|| / ||b||."""
    return float(jnp.linalg.norm((a - b).ravel()) / jnp.linalg.norm(b.ravel()))


def inputs(T, decay, delta, seed=0):
    ks = jax.random.split(jax.random.key(seed), 7)
    k = jax.random.normal(ks[1], (B, T, H, DK))
    if delta:
        k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
    log_a = {"none": None,
             "scalar": jax.nn.log_sigmoid(2 * jax.random.normal(ks[3], (B, T, H, 1))),
             "vector": jax.nn.log_sigmoid(2 * jax.random.normal(ks[3], (B, T, H, DK)))}[decay]
    beta = None if decay == "none" and not delta else jax.nn.sigmoid(jax.random.normal(ks[4], (B, T, H)))
    return dict(q=jax.random.normal(ks[0], (B, T, H, DK)), k=k, v=jax.random.normal(ks[2], (B, T, H, DV)),
                log_a=log_a, beta=beta, state=jax.random.normal(ks[5], (B, H, DK, DV)))


@partial(jax.jit, static_argnums=(0, 2), static_argnames=("chunk", "sub_chunk"))
def value_and_grads(form, x, delta, **kw):
    """(o, final state) and the gradients of a random projection of both w.r.t. every input."""
    names = [n for n in x if x[n] is not None]
    T = x["q"].shape[1]
    do = jax.random.normal(jax.random.key(7), (B, T, H, DV))
    dS = jax.random.normal(jax.random.key(8), (B, H, DK, DV))

    def loss(*args):
        o, S = form(**dict(x, **dict(zip(names, args))), delta=delta, precision=FULL, **kw)
        return jnp.sum(o * do[:, :o.shape[1]]) + jnp.sum(S * dS), (o, S)

    grads, (o, S) = jax.grad(loss, argnums=tuple(range(len(names))), has_aux=True)(*[x[n] for n in names])
    return (o, S), dict(zip(names, grads))


# scalar-add, vector-delta and none-add (linear attention: no decay, no write strength) run every branch of
# `chunked`; the other rows are their cross-products. The quick subset runs one row per test.
slow = pytest.mark.slow
ROWS = [pytest.param(decay, delta, id=f"{decay}-{'delta' if delta else 'add'}")
        for decay in ("scalar", "vector", "none") for delta in (False, True)]


@pytest.mark.parametrize("decay, delta", quick_only(ROWS, {"vector-delta"}))
def test_chunked_equals_recurrent_outputs_state_and_gradients(decay, delta):
    T = 13  # a length no chunk size below divides but 1
    x = inputs(T, decay, delta)
    (o_ref, S_ref), g_ref = value_and_grads(recurrent, x, delta)
    sizes = ((1, 16), (6, 3)) + (((16, 16),) if delta else ())  # 1, not a power of two, longer than T
    for chunk, sub_chunk in sizes:
        (o, S), g = value_and_grads(chunked, x, delta, chunk=chunk, sub_chunk=sub_chunk)
        assert rel_err(o, o_ref) <= TOL, chunk
        assert rel_err(S, S_ref) <= TOL, chunk
        for name in g_ref:
            assert rel_err(g[name], g_ref[name]) <= TOL, (chunk, name)


def recurrent_read_at(*, read_at, **kw):
    """The definition read after the tokens read_at [B, Q] only."""
    o, S = recurrent(**kw)
    return at_positions(o, read_at), S


@pytest.mark.parametrize("decay, delta", quick_only(ROWS, {"scalar-add"}))
def test_an_empty_state_and_reads_at_positions_equal_the_definition(decay, delta):
    """The paths training takes: from no state (one chunk has no loop and reads no state) and a last layer
    that reads at a few positions (here unsorted, repeated, first and last), in one chunk and in several."""
    x = dict(inputs(13, decay, delta), state=None)
    read_at = jnp.array([[12, 0, 5, 5], [3, 7, 11, 1]])
    for kw in ({}, {"read_at": read_at}):
        definition = partial(recurrent_read_at, **kw) if kw else recurrent
        (o_ref, S_ref), g_ref = value_and_grads(definition, x, delta)
        for chunk in (16, 4):
            (o, S), g = value_and_grads(partial(chunked, chunk=chunk, sub_chunk=2, **kw), x, delta)
            assert rel_err(o, o_ref) <= TOL, (chunk, kw)
            assert rel_err(S, S_ref) <= TOL, (chunk, kw)
            for name in g_ref:
                assert rel_err(g[name], g_ref[name]) <= TOL, (chunk, name, kw)


# the paths a shared decay takes: several chunks from a state, one chunk from none, and reads at positions from
# each; the quick subset keeps the one that passes through all of chunked's branches
SHARED_PATHS = [pytest.param(True, False, id="state"), pytest.param(False, False, id="empty"),
                pytest.param(False, True, id="empty-read-at"), pytest.param(True, True, id="state-read-at")]


@pytest.mark.parametrize("from_state, reads", quick_only(SHARED_PATHS, {"state-read-at"}))
def test_a_decay_shared_by_the_batch_equals_it_given_to_every_example(from_state, reads):
    """RetNet's fixed decay is passed once, [1, T, H, 1], so its factors are made once: the chunked form with it
    equals the definition with it repeated for every example, in outputs, final state and gradients."""
    x = inputs(13, "scalar", False)
    shared = jax.nn.log_sigmoid(2 * jax.random.normal(jax.random.key(3), (1, 13, H, 1)))
    kw = {"read_at": jnp.array([[12, 0, 5, 5], [3, 7, 11, 1]])} if reads else {}
    every = dict(x, log_a=jnp.broadcast_to(shared, (B, 13, H, 1)), state=x["state"] if from_state else None)
    definition = partial(recurrent_read_at, **kw) if kw else recurrent
    (o_ref, S_ref), g_ref = value_and_grads(definition, every, False)
    g_ref = dict(g_ref, log_a=g_ref["log_a"].sum(0, keepdims=True))  # the shared decay's gradient: the batch's sum
    for chunk in (16, 4):
        (o, S), g = value_and_grads(partial(chunked, chunk=chunk, **kw), dict(every, log_a=shared), False)
        assert rel_err(o, o_ref) <= TOL and rel_err(S, S_ref) <= TOL, chunk
        for name in g_ref:
            assert rel_err(g[name], g_ref[name]) <= TOL, (chunk, name)


SHARED_QK = [pytest.param("scalar", False, True, True, id="scalar-add-state-read-at"),
             pytest.param("scalar", False, False, False, id="scalar-add-empty", marks=slow),
             pytest.param("none", True, False, True, id="none-delta-empty-read-at", marks=slow),
             pytest.param("vector", True, True, False, id="vector-delta-state", marks=slow)]


@pytest.mark.parametrize("decay, delta, from_state, reads", SHARED_QK)
def test_a_q_and_k_shared_by_the_heads_equal_them_given_to_every_head(decay, delta, from_state, reads):
    """Mamba-2's one group passes q and k as [B, T, 1, d_k], so their scores are made once for all heads: both
    forms with them equal the definition with them repeated for every head, in outputs, final state and
    gradients (the shared q's and k's: the sum of the heads')."""
    x = inputs(13, decay, delta)
    x = dict(x, state=x["state"] if from_state else None)
    shared = {name: x[name][:, :, :1] for name in ("q", "k")}
    kw = {"read_at": jnp.array([[12, 0, 5, 5], [3, 7, 11, 1]])} if reads else {}
    every = dict(x, **{name: jnp.broadcast_to(y, x[name].shape) for name, y in shared.items()})
    definition = partial(recurrent_read_at, **kw) if kw else recurrent
    (o_ref, S_ref), g_ref = value_and_grads(definition, every, delta)
    g_ref = dict(g_ref, **{name: g_ref[name].sum(2, keepdims=True) for name in shared})
    for form in (partial(chunked, chunk=16, **kw), partial(chunked, chunk=4, sub_chunk=2, **kw), definition):
        (o, S), g = value_and_grads(form, dict(every, **shared), delta)
        assert rel_err(o, o_ref) <= TOL and rel_err(S, S_ref) <= TOL, form
        for name in g_ref:
            assert rel_err(g[name], g_ref[name]) <= TOL, (form, name)


@slow  # 6 s; the quick subset continues from a state in test_continuing_from_a_state_equals_one_pass
def test_reads_at_positions_continue_from_a_state():
    x = inputs(13, "vector", True)
    read_at = jnp.array([[12, 0, 5, 5], [3, 7, 11, 1]])
    (o_ref, S_ref), g_ref = value_and_grads(partial(recurrent_read_at, read_at=read_at), x, True)
    for chunk in (16, 4):
        (o, S), g = value_and_grads(partial(chunked, chunk=chunk, sub_chunk=2, read_at=read_at), x, True)
        assert rel_err(o, o_ref) <= TOL, chunk
        for name in g_ref:
            assert rel_err(g[name], g_ref[name]) <= TOL, (chunk, name)


def test_continuing_from_a_state_equals_one_pass():
    x = inputs(14, "vector", True)
    o_ref, S_ref = jax.jit(partial(recurrent, precision=FULL), static_argnames="delta")(**x, delta=True)
    form = jax.jit(partial(chunked, chunk=4, sub_chunk=2, precision=FULL), static_argnames="delta")
    first, second = ({n: a if n == "state" else a[:, part] for n, a in x.items()} for part in (slice(7), slice(7, 14)))
    o1, S1 = form(**first, delta=True)  # 7 tokens: not a multiple of the chunk
    o2, S2 = form(**dict(second, state=S1), delta=True)
    assert rel_err(jnp.concatenate([o1, o2], 1), o_ref) <= TOL
    assert rel_err(S2, S_ref) <= TOL


def vector_decay_scores(x, k, b):
    """The definition: A_ij = sum_c x_ic k_jc exp(b_ic - b_jc) for j <= i, every decay made apart."""
    C = x.shape[-2]
    diff = b[..., :, None, :] - b[..., None, :, :]
    decay = jnp.exp(jnp.where(jnp.tril(jnp.ones((C, C), bool))[..., None], diff, -jnp.inf))
    return jnp.einsum("...ik,...jk,...ijk->...ij", x, k, decay, precision=FULL)


def vector_inputs(C, per_token):
    """x, k and a cumulative log decay whose channels fall by about per_token a token."""
    ks = jax.random.split(jax.random.key(3), 3)
    x, k = jax.random.normal(ks[0], (2, C, DK)), jax.random.normal(ks[1], (2, C, DK))
    return x, k, jnp.cumsum(per_token * jax.nn.log_sigmoid(jax.random.normal(ks[2], (2, C, DK))), axis=-2)


def test_vector_scores_in_sub_chunks_and_through_one_reference_equal_per_channel_decays():
    x, k, b = vector_inputs(12, 1.0)
    want = vector_decay_scores(x, k, b)
    subs = (1, 3, 4, 12)  # blocks of one token, of several, and the whole chunk as one block
    got = jax.jit(lambda x, k, b: [sub_chunk_scores(x, k, b, sub, precision=FULL) for sub in subs]
                  + [one_reference_scores(x, k, b, precision=FULL)])(x, k, b)
    for form, scores in zip([*subs, "one reference"], got):
        assert rel_err(scores, want) <= TOL, form


@pytest.mark.parametrize("per_token, fits", [(1.0, True), (40.0, False)])
def test_vector_scores_take_the_form_their_decays_fit_with_its_gradients(per_token, fits):
    x, k, b = vector_inputs(12, per_token)  # spans of about 10 and about 400 in twelve tokens
    assert bool(jnp.max(b[:, 0] - b[:, -1]) <= 2 * ONE_REFERENCE_SPAN) == fits
    d = jax.random.normal(jax.random.key(4), (2, 12, 12))

    def value_and_grad(form):
        return jax.jit(jax.value_and_grad(lambda *a: jnp.sum(form(*a) * d), argnums=(0, 1, 2)))(x, k, b)

    want, want_grads = value_and_grad(vector_decay_scores)
    got, grads = value_and_grad(partial(intra_scores, sub_chunk=4, precision=FULL))
    assert abs(float(got - want)) <= TOL * abs(float(want))
    for name, g, g_ref in zip("xkb", grads, want_grads):
        assert rel_err(g, g_ref) <= TOL, name
    # the test can fail: one reference is wrong where it does not fit (its factors clipped to stay finite)
    one = one_reference_scores(x, k, b, precision=FULL)
    assert bool(jnp.isfinite(one).all()) and (rel_err(one, vector_decay_scores(x, k, b)) <= TOL) == fits


def test_vmapped_vector_scores_hold_where_one_example_fits_and_another_does_not():
    x, k, b = vector_inputs(12, 1.0)
    b = b.at[1].multiply(40.0)  # the second example spans about 400
    scores = jax.jit(jax.vmap(partial(intra_scores, sub_chunk=4, precision=FULL)))
    assert rel_err(scores(x, k, b), vector_decay_scores(x, k, b)) <= TOL
    grad = lambda form: jax.jit(jax.grad(lambda b: jnp.sum(form(x, k, b))))(b)  # noqa: E731
    assert rel_err(grad(jax.vmap(partial(intra_scores, sub_chunk=4, precision=FULL))),
                   grad(vector_decay_scores)) <= TOL


@pytest.mark.parametrize("decay, form", [pytest.param("scalar", chunked, marks=slow), ("vector", chunked),
                                         pytest.param("vector", recurrent, marks=slow)])
def test_strong_decays_give_finite_gradients(decay, form):
    x = inputs(11, decay, True)
    x["log_a"] = jnp.full_like(x["log_a"], -1e4).at[:, ::3].set(-80.0)
    kw = {"chunk": 8, "sub_chunk": 4} if form is chunked else {}
    (o, S), g = value_and_grads(form, x, True, **kw)
    assert all(bool(jnp.isfinite(a).all()) for a in (o, S, *g.values()))
    assert float(jnp.abs(g["log_a"]).max()) > 0  # the gates still get a gradient where it is not vanishing


def dot_precisions(form, **kw) -> list[str]:
    """The precision of every dot_general in the lowered gated-delta memory (StableHLO text)."""
    x = inputs(9, "scalar", True)
    text = jax.jit(partial(form, delta=True, **kw)).lower(**x).as_text()
    dots = [line for line in text.splitlines() if "dot_general" in line]
    assert dots
    return ["HIGHEST" if "HIGHEST" in line else "default" for line in dots]


@pytest.mark.parametrize("form, kw", [(chunked, {"chunk": 4}), (recurrent, {})], ids=["chunked", "recurrent"])
def test_precision_reaches_every_matmul(form, kw):
    # pinned, every matmul runs in full float32; by default only the chunk's cumulative log decay does
    # (a sum of gates, not a learned product), so a GPU may use TF32 for the rest
    assert set(dot_precisions(form, precision=FULL, **kw)) == {"HIGHEST"}
    default = dot_precisions(form, **kw)
    assert default.count("HIGHEST") == (1 if form is chunked else 0), default


@pytest.mark.parametrize("C", quick_only([12, 64], {"12"}))  # padded to a power of two; the default chunk
def test_the_ut_solve_reads_below_the_diagonal_only_and_equals_a_triangular_solve(C):
    """(I + L)^{-1} R from L's strictly lower triangle, whatever is on and above the diagonal (the delta rule
    hands it the read's scores, diagonal included): outputs and gradients of a triangular solve."""
    kL, kR, kG = jax.random.split(jax.random.key(3), 3)
    L = 0.3 * jax.random.normal(kL, (2, C, C))
    R = jax.random.normal(kR, (2, C, 5))
    dU = jax.random.normal(kG, (2, C, 5))
    strict = jnp.tril(jnp.ones((C, C), bool), -1)

    def reference(L, R):
        unit = jnp.eye(C)[None] + jnp.where(strict[None], L, 0.0)
        return jax.scipy.linalg.solve_triangular(unit, R, lower=True)

    got, pull = jax.vjp(lambda L, R: unit_lower_solve(L, R, FULL), L, R)
    want, pull_want = jax.vjp(reference, L, R)
    assert rel_err(got, want) < TOL
    (dL, dR), (dL_want, dR_want) = pull(dU), pull_want(dU)
    assert rel_err(dR, dR_want) < TOL and rel_err(dL, dL_want) < TOL
    assert not jnp.any(jnp.where(strict[None], 0.0, dL))  # nothing on or above the diagonal is read
