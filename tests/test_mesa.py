"""The mesa memory (tmem/memory/mesa.py): the training form equals the definition, which is the ridge solution."""

from functools import partial
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tmem.memory import mesa, ridge_solve
from tmem.memory.reads import at_positions
from tmem.memory.stores import rls_init, rls_writes
from tmem.mixers.base import resumable_fields
from tmem.mixers.mesa import CHUNKED_FROM, MesaConfig, MesaRun

B, H, DK, DV = 2, 2, 4, 3
T = 13  # no chunk size used below divides it
FULL = jax.lax.Precision.HIGHEST


def rel_err(a, b):
    return float(jnp.linalg.norm((a - b).ravel()) / jnp.linalg.norm(b.ravel()))


def inputs(seed=0, with_state=True):
    ks = jax.random.split(jax.random.key(seed), 8)
    unit = lambda x: x / jnp.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731  the layer's L2-normed q, k
    state = None
    if with_state:  # a state the layer could have made: H from earlier unit keys, so H + Lambda stays well posed
        k0 = unit(jax.random.normal(ks[6], (B, H, 5, DK)))
        state = (jnp.einsum("bhik,bhil->bhkl", k0, k0), jax.random.normal(ks[7], (B, H, DK, DV)))
    return dict(q=unit(jax.random.normal(ks[0], (B, T, H, DK))), k=unit(jax.random.normal(ks[1], (B, T, H, DK))),
                v=jax.random.normal(ks[2], (B, T, H, DV)),
                log_a=jax.nn.log_sigmoid(2 + jax.random.normal(ks[3], (B, T, H))),
                beta=jax.nn.sigmoid(jax.random.normal(ks[4], (B, T, H))),
                lam=0.25 + jax.nn.softplus(jax.random.normal(ks[5], (H, DK))), state=state)


@partial(jax.jit, static_argnums=0, static_argnames=("solver", "cg_steps", "chunk"))
def value_and_grads(form, x, **kw):
    """(o, (H, G)) and the gradients of a random projection of all three w.r.t. every input."""
    names = [n for n in x if x[n] is not None]
    do = jax.random.normal(jax.random.key(7), (B, T, H, DV))
    dH, dG = jax.random.normal(jax.random.key(8), (B, H, DK, DK)), jax.random.normal(jax.random.key(9), (B, H, DK, DV))

    def loss(*args):
        o, (Hs, Gs) = form(**dict(x, **dict(zip(names, args))), precision=FULL, **kw)
        return jnp.sum(o * do) + jnp.sum(Hs * dH) + jnp.sum(Gs * dG), (o, Hs, Gs)

    grads, out = jax.grad(loss, argnums=tuple(range(len(names))), has_aux=True)(*[x[n] for n in names])
    return out, dict(zip(names, jax.tree.leaves(grads)))


@pytest.mark.parametrize("solver, chunk, with_state", [pytest.param("cg", 64, True, marks=pytest.mark.slow),
                                                       pytest.param("cg", 4, False, marks=pytest.mark.slow),
                                                       ("cholesky", 6, True)])
def test_the_training_form_equals_the_definition_outputs_state_and_gradients(solver, chunk, with_state):
    """CG with 3 d_k steps (d_k suffice in exact arithmetic) and the Cholesky solve against the token loop's
    exact solve: one chunk (the masked quadratic form, no loop) and chunks of 4 and 6 with the state passed."""
    assert_the_definition(mesa.parallel, inputs(with_state=with_state), solver=solver, cg_steps=3 * DK, chunk=chunk)


@pytest.mark.parametrize("chunk, with_state", [(4, True), pytest.param(6, False, marks=pytest.mark.slow),
                                               pytest.param(64, True, marks=pytest.mark.slow)])
def test_the_chunked_cg_form_equals_the_definition_outputs_state_and_gradients(chunk, with_state):
    """MesaNet's chunked CG (each H_t p from its chunk's entry state and keys, no H_t made), chunks passing the
    state (4: T = 13 ends inside the fourth) and one chunk from a state."""
    assert_the_definition(mesa.chunked_cg, inputs(with_state=with_state), cg_steps=3 * DK, chunk=chunk)


def assert_the_definition(form, x, **kw):
    ref, g_ref = value_and_grads(mesa.recurrent, x)
    out, g = value_and_grads(form, x, **kw)
    for a, b in zip(out, ref):
        assert rel_err(a, b) <= 1e-5
    for name in g_ref:
        assert rel_err(g[name], g_ref[name]) <= 1e-5, name


@pytest.mark.parametrize("form", [mesa.parallel, mesa.chunked_cg])
def test_a_few_cg_steps_are_not_the_solve(form):
    """The comparisons above can fail: one CG step from the Jacobi guess leaves an error far above 1e-5."""
    x = inputs()
    (o_ref, *_), _ = value_and_grads(mesa.recurrent, x)
    (o, *_), _ = value_and_grads(form, x, cg_steps=1, chunk=4)
    assert rel_err(o, o_ref) > 1e-3


@pytest.mark.slow  # 5 s from a cold cache; the quick subset runs the training form against the definition
def test_reads_at_positions_equal_the_definitions_rows():
    """Every form reading at 3 positions (one twice) against the definition's rows there, values, state and
    gradients, from a state: chunks of 4 (the parallel form makes H_t at the 3 reads alone, from their chunks'
    entry states) and of 2 (fewer tokens than reads: every token's system, the others with no right side)."""
    x = inputs()
    read_at = jnp.array([[0, 12, 5], [7, 7, 3]])
    names = [n for n in x if n != "state"]
    w = jax.random.normal(jax.random.key(7), (B, 3, H, DV))

    def projected(form, **kw):  # o at the reads and both final sums, projected, and its gradients
        def loss(*args):
            o, S = form(**dict(x, **dict(zip(names, args))), precision=FULL, **kw)
            if o.shape[1] == T:
                o = at_positions(o, read_at)
            return jnp.sum(w * o) + sum(jnp.sum(jnp.sin(s)) for s in S), (o, S)
        return jax.grad(loss, argnums=tuple(range(len(names))), has_aux=True)(*[x[n] for n in names])

    g_ref, (o_ref, S_ref) = jax.jit(partial(projected, mesa.recurrent))()  # one program each: 5 s cold, not 13
    forms = [partial(mesa.parallel, solver=solver) for solver in mesa.SOLVERS] + [mesa.chunked_cg]
    for form, chunk in [(form, 4) for form in forms] + [(mesa.parallel, 2)]:
        g, (o, S) = jax.jit(partial(projected, form, cg_steps=12, chunk=chunk, read_at=read_at))()
        assert rel_err(o, o_ref) <= 1e-5
        assert all(rel_err(a, b) <= 1e-5 for a, b in zip(S, S_ref))
        assert all(rel_err(a, b) <= 1e-5 for a, b in zip(g, g_ref)), form


@pytest.mark.parametrize("solver", mesa.SOLVERS)
@pytest.mark.parametrize("state", [None, "shared", "each"])
def test_the_solves_backward_through_the_keys_is_autodiffs_through_the_sums(solver, state):
    """ridge_solve's gradients, contracted through the keys, against autodiff through the sums made whole and an
    exact solve (LU): the weights, keys, right sides, Lambda and, where a state enters, its decay and the state,
    one for all the reads or one each."""
    ks = jax.random.split(jax.random.key(3), 6)
    R, J = 5, 7
    W = jnp.tril(jax.nn.sigmoid(jax.random.normal(ks[0], (B, H, R, J))), 2)
    k = jax.random.normal(ks[1], (B, H, J, DK)) / 2
    q = jax.random.normal(ks[2], (B, H, R, DK))
    lam = 0.25 + jax.nn.softplus(jax.random.normal(ks[3], (1, H, 1, DK)))
    e = S = None
    if state is not None:
        e = jax.nn.sigmoid(jax.random.normal(ks[4], (B, H, R)))
        S = jax.random.normal(ks[5], (B, H, 1 if state == "shared" else R, DK, DK))
        S = jnp.einsum("...kl,...ml->...km", S, S) / DK

    def exact(W, k, q, lam, e, S):
        A = ridge_solve.sums(W, k, e, S, FULL) + jnp.broadcast_to(lam, q.shape)[..., None] * jnp.eye(DK)[None, None, None]
        return jnp.linalg.solve(A, q[..., None])[..., 0]

    def fast(W, k, q, lam, e, S):
        return ridge_solve.ridge_solve(W, k, q, lam, e, S, solver, 3 * DK, FULL)

    w = jax.random.normal(jax.random.key(9), q.shape)
    args = (W, k, q, lam, e, S)
    wrt = (0, 1, 2, 3) if state is None else (0, 1, 2, 3, 4, 5)
    assert rel_err(fast(*args), exact(*args)) <= 1e-5
    grads = [jax.grad(lambda *a, f=f: jnp.sum(w * jnp.sin(f(*a))), argnums=wrt)(*args) for f in (fast, exact)]
    for a, b in zip(*grads):
        assert a.shape == b.shape and rel_err(a, b) <= 1e-5


def test_the_definition_is_the_gamma_weighted_ridge_solution_of_each_prefix():
    """o_t = W_t q_t with W_t = argmin sum_{i<=t} gamma_i^(t) ||v_i - W k_i||^2 + sum_c lambda_c ||W e_c||^2,
    gamma_i^(t) = beta_i prod_{i<j<=t} a_j, solved in float64 from the weights themselves."""
    x = inputs(with_state=False)
    o, _ = mesa.recurrent(**x, precision=FULL)
    q, k, v, log_a, beta, lam = (np.asarray(x[n], np.float64) for n in ("q", "k", "v", "log_a", "beta", "lam"))
    for b, h, t in [(0, 0, 0), (1, 1, 6), (0, 1, 12)]:
        gamma = beta[b, : t + 1, h] * np.exp([log_a[b, i + 1: t + 1, h].sum() for i in range(t + 1)])
        K, V = k[b, : t + 1, h], v[b, : t + 1, h]
        W = np.linalg.solve(K.T @ (gamma[:, None] * K) + np.diag(lam[h]), K.T @ (gamma[:, None] * V)).T
        np.testing.assert_allclose(o[b, t, h], W @ q[b, t, h], rtol=1e-5, atol=1e-6)


def test_with_every_gate_open_it_is_recursive_least_squares():
    """a = beta = 1 and one lambda for all channels: the Sherman-Morrison recursion of D5 (tmem.memory.stores)."""
    x = inputs(with_state=False)
    x.update(log_a=jnp.zeros((B, T, H)), beta=jnp.ones((B, T, H)), lam=jnp.full((H, DK), 0.7))
    o, _ = mesa.recurrent(**x, precision=FULL)
    for t in (0, 3, 12):
        S, _ = rls_writes(rls_init(DK, DV, ridge=0.7), x["k"][0, : t + 1, 1], x["v"][0, : t + 1, 1])
        np.testing.assert_allclose(o[0, t, 1], S.T @ x["q"][0, t, 1], rtol=1e-4, atol=1e-5)


def test_the_default_cg_steps_are_the_key_width_at_most_mesanets_30_and_a_resume_may_change_them():
    task = SimpleNamespace(seq_len=64)
    assert [MesaConfig(heads=h).fit(task, 64).cg_steps for h in (4, 2, 1)] == [16, 30, 30]  # d_k 16, 32, 64
    assert MesaConfig(heads=4).fit(task, 256).cg_steps == 30
    assert MesaConfig(cg_steps=7).fit(task, 64).cg_steps == 7  # a given count is kept
    assert "cg_steps" in resumable_fields(MesaConfig)  # the same function: a run saved at 30 resumes at 16


def test_auto_takes_the_chunked_form_from_long_sequences_of_wide_keys_and_the_exact_solve_never():
    long, short = SimpleNamespace(seq_len=CHUNKED_FROM), SimpleNamespace(seq_len=CHUNKED_FROM - 2)
    wide, narrow = MesaConfig(heads=2), MesaConfig(heads=4)  # d_k = 32 and 16 at width 64
    assert wide.fit(long, 64).run.form == "chunked"
    assert wide.fit(short, 64).run.form == "parallel"
    assert narrow.fit(long, 64).run.form == "parallel"  # H_t of 16 x 16 costs no more than the chunks' scores
    assert narrow.fit(long, 128).run.form == "chunked"
    assert MesaConfig(heads=2, solver="cholesky").fit(long, 64).run.form == "parallel"  # it needs every H_t
    with pytest.raises(ValueError, match="mixer.solver=cholesky needs every H_t"):
        MesaConfig(run=MesaRun("chunked"), solver="cholesky").check(64)
