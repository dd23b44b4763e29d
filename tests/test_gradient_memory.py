"""The gradient memory (tmem/memory/gradient.py): its parallel form equals its definition, and the note's oracles.

* Every parallel form equals the token loop (outputs, final state, gradients), for a linear and an MLP memory,
  with and without momentum, decay, LayerNorm and residual, from a fresh state and from one cut inside a
  mini-batch.
* With TTT's settings and a linear memory it equals TTT-Linear's own dual form (tmem/memory/ttt.py), which was
  written independently, with the LayerNorm's backward by hand.
* Chapter 10: a linear memory without LayerNorm, residual or the v - k target, from W_0 = 0, with a constant rate
  1 on the half-loss 1/2 ||v - k W||^2 (1/2 on TTT's loss ||v - k W||^2) and one mini-batch of the whole
  sequence is linear attention without normaliser.
* Titans: that memory with momentum 0, no forget gate and mini-batches of one token is the delta rule with
  beta_t = theta_t on the half-loss (2 theta_t on Titans' loss ||M(k) - v||^2).
"""

from functools import partial

import jax
import jax.numpy as jnp
import pytest

from tmem.memory import gradient, ttt
from tmem.memory.key_gradients import key_gradients
from tmem.memory.reads import at_positions
from tmem.memory.linear_state import recurrent as linear_recurrent

B, T, H, D, HIDDEN = 2, 13, 2, 4, 8
FULL = jax.lax.Precision.HIGHEST


def rel_err(a, b):
    diff, norm = float(jnp.linalg.norm((a - b).ravel())), float(jnp.linalg.norm(b.ravel()))
    return diff / norm if norm else diff


def inputs(inner, *, momentum, decay, mini_batch, start, seed=0, initial=False):
    """The memory's inputs; initial: from the initial model (`initial`, no state), else from a state."""
    ks = jax.random.split(jax.random.key(seed), 12)
    normal = lambda i, shape, s=1.0: s * jax.random.normal(ks[i], shape)  # noqa: E731
    params = gradient.init_params(inner, H, D, HIDDEN, ks[9], 0.3)
    M0, U, A, S = gradient.initial_state(params, B, momentum)
    if start:  # a state cut inside a mini-batch: a change since M_0, a decay product, a momentum
        U = jax.tree.map(lambda x: normal(10, x.shape, 0.1), U)
        A = jnp.full((B, H), 0.7)
    if momentum:
        S = jax.tree.map(lambda x: normal(11, x.shape, 0.1), S)
    b = mini_batch or 1
    return dict(q=normal(0, (B, T, H, D)), k=normal(1, (B, T, H, D)), v=normal(2, (B, T, H, D)),
                theta=jax.nn.sigmoid(normal(3, (B, T, H))) / D,
                log_a=jax.nn.log_sigmoid(normal(4, (B, T, H)) + 3) if decay else None,
                log_eta=jax.nn.log_sigmoid(normal(5, (B, T, H))) if momentum else None,
                tok=None if mini_batch is None else jnp.maximum(1 / jnp.arange(1, b + 1) + normal(6, (b,), 0.1), 0),
                ln=(1 + normal(7, (H, D), 0.1), normal(8, (H, D), 0.1)),
                **(dict(initial=params) if initial else dict(state=(M0, U, A, S))))


@partial(jax.jit, static_argnums=(0, 1), static_argnames=("mini_batch", "start"))
def value_and_grads(form, inner, x, **kw):
    """(o, state) and the gradients of a random projection of both w.r.t. every input (o [B, T or Q, H, D])."""
    def loss(x):
        with jax.default_matmul_precision("highest"):
            o, S = form(inner=inner, **x, **kw)
        do = jax.random.normal(jax.random.key(7), o.shape)
        return jnp.sum(o * do) + sum(jnp.sum(jnp.sin(s)) for s in jax.tree.leaves(S)), (o, S)

    grads, out = jax.grad(loss, has_aux=True)(x)
    return out, grads


# a call of at most gradient.UNROLLED mini-batches runs each as its own code (the cuts at 4), a longer one scans
# over the middle ones (the pairs: 7 mini-batches). From the initial model (no state), the first mini-batch reads
# one model for the batch and no momentum. Half the cases' blocks keep only their matmuls for the backward pass
# (Titans' run.saved), the other half everything (TTT-MLP's)
CASES = {  # inner model (function, bias, norm), momentum, decay, mini-batch, start, from the initial model, saved
    "ttt-linear-cut": (("linear", True, True), False, False, 4, 3, False, "all"),
    "mlp-momentum-decay-cut": (("mlp", True, True), True, True, 4, 7, False, "matmuls"),  # 7 tokens: 3 into the 2nd
    "bare-mlp-initial": (("mlp", False, False), True, True, 4, 0, True, "all"),
    "bare-mlp-pairs-initial": (("mlp", False, False), True, True, 2, 0, True, "matmuls"),
    "mlp-one-step-continued": (("mlp", True, True), True, False, None, 5, False, "matmuls"),
    "linear-one-step-initial": (("linear", True, True), True, True, None, 0, True, "all"),
}


# every case compiles a token loop of autodiff steps (TTT-Linear's 6 s, the MLPs' 10-22 s): the full suite's; the
# quick subset's TTT-Linear oracle is tests/test_ttt.py's dual form
@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_parallel_form_equals_the_definition_outputs_state_and_gradients(case):
    spec, momentum, decay, mini_batch, start, initial, saved = CASES[case]
    inner = gradient.Inner(*spec)
    x = inputs(inner, momentum=momentum, decay=decay, mini_batch=mini_batch, start=start, initial=initial)
    (o_ref, S_ref), g_ref = value_and_grads(gradient.recurrent, inner, x, mini_batch=mini_batch, start=start)
    (o, S), g = value_and_grads(partial(gradient.parallel, saved=saved), inner, x, mini_batch=mini_batch,
                                start=start)
    assert rel_err(o, o_ref) <= 1e-5
    for a, b in zip(jax.tree.leaves(S), jax.tree.leaves(S_ref), strict=True):
        assert rel_err(a, b) <= 1e-5
    if not initial and start % (mini_batch or T + start) == 0:  # a call that begins a mini-batch takes U = 0 and
        # A = 1 as given
        g, g_ref = ({**grads, "state": grads["state"][:1] + grads["state"][3:]} for grads in (g, g_ref))
    paths = jax.tree_util.tree_flatten_with_path(g_ref)[0]
    for (path, b), a in zip(paths, jax.tree.leaves(g), strict=True):
        assert rel_err(a, b) <= 1e-5, jax.tree_util.keystr(path)


@pytest.mark.parametrize("spec", [(f, bias, norm) for f in gradient.FUNCTIONS for bias in (True, False)
                                  for norm in (True, False)], ids=str)
def test_the_keys_pass_and_its_written_out_backward_are_autodiffs(spec):
    """key_gradients (the parallel form's keys: each hidden layer's input and each layer's delta, the gradient of
    the half-loss in its output) and its hand-written backward, against autodiff of the half-loss and autodiff
    of that, for every inner model; one head, a mini-batch of 5, the weights away from zero."""
    inner = gradient.Inner(*spec)
    ks = jax.random.split(jax.random.key(1), 6)
    params = jax.tree.map(lambda p: p[0], gradient.init_params(inner, 1, D, HIDDEN, ks[0], 0.5))
    k, v = jax.random.normal(ks[1], (5, D)), jax.random.normal(ks[2], (5, D))
    ln = (1 + 0.3 * jax.random.normal(ks[3], (D,)), 0.3 * jax.random.normal(ks[4], (D,)))

    def autodiff(params, k, v, ln):  # the deltas as gradients in zero additions to each pre-activation
        def loss(add):
            h = k
            hidden = []
            for layer in range(1, inner.layers + 1):
                z = h @ params[f"W{layer}"] + add[layer - 1]
                z = z + params[f"b{layer}"][None] if inner.bias else z
                h = jax.nn.gelu(z, approximate=True) if layer < inner.layers else z
                hidden.append(h)
            y = ttt.layer_norm(h, *(p[None] for p in ln)) if inner.norm else h
            return 0.5 * jnp.sum(jnp.square(y - (v - k if inner.norm else v))), hidden[:-1]

        add = [jnp.zeros((5, params[f"W{layer}"].shape[1])) for layer in range(1, inner.layers + 1)]
        deltas, hidden = jax.grad(loss, has_aux=True)(add)
        return hidden, deltas

    with jax.default_matmul_precision("highest"):
        out_ref, vjp_ref = jax.vjp(autodiff, params, k, v, ln)
        out, vjp = jax.vjp(partial(key_gradients, inner), params, k, v, ln)
        cotangent = jax.tree.map(lambda x: jax.random.normal(ks[5], x.shape), out_ref)
        grads, grads_ref = vjp(cotangent), vjp_ref(cotangent)
    for a, b in zip(jax.tree.leaves((out, grads)), jax.tree.leaves((out_ref, grads_ref)), strict=True):
        assert rel_err(a, b) <= 1e-5


# positions unsorted and repeated, the first and last among them: for T = 13 in mini-batches of 4 from a cut at 3,
# reads in every block (unrolled); in pairs from the initial model, in five of seven (scanned)
READ_AT = jnp.array([[12, 0, 5, 5], [3, 9, 12, 1]])


@pytest.mark.slow  # 2 to 4 s each
@pytest.mark.parametrize("case", ["ttt-linear-cut", "bare-mlp-pairs-initial"])
def test_reading_at_positions_is_the_parallel_forms_reads_there_state_and_gradients(case):
    """read_at makes each block read the given queries only (the last layer's, where the loss reads): the
    outputs there, the state and every gradient are the whole form's (itself tested against the definition)."""
    spec, momentum, decay, mini_batch, start, initial, _ = CASES[case]
    inner = gradient.Inner(*spec)
    x = inputs(inner, momentum=momentum, decay=decay, mini_batch=mini_batch, start=start, initial=initial)

    def taken(**x):  # the whole form's reads, taken at the positions
        o, S = gradient.parallel(**x)
        return at_positions(o, READ_AT), S

    kw = dict(mini_batch=mini_batch, start=start)
    (o_ref, S_ref), g_ref = value_and_grads(taken, inner, x, **kw)
    (o, S), g = value_and_grads(gradient.parallel, inner, x, read_at=READ_AT, **kw)
    assert o.shape == o_ref.shape and rel_err(o, o_ref) <= 1e-5
    for a, b in zip(jax.tree.leaves((S, g)), jax.tree.leaves((S_ref, g_ref)), strict=True):
        assert rel_err(a, b) <= 1e-5


@pytest.mark.slow  # 4 s; tests/test_ttt.py checks TTT-Linear's dual form against its definition in the quick subset
def test_a_linear_memory_with_ttts_settings_is_ttt_linears_own_dual_form():
    inner = gradient.Inner("linear", bias=True, norm=True)
    x = inputs(inner, momentum=False, decay=False, mini_batch=4, start=3)
    M0, U, _, _ = x["state"]
    o, (M, U_end, _, _) = gradient.parallel(**{**x, "state": (M0, U, jnp.ones((B, H)), None)}, inner=inner,
                                            mini_batch=4, start=3)
    # TTT-Linear's state is the mini-batch's start and the rate-weighted gradient sums: dW = -U
    o_ttt, (W, b, dW, db) = ttt.dual(x["q"], x["k"], x["v"], lr=x["theta"], token_lr=x["tok"], ln_scale=x["ln"][0],
                                     ln_bias=x["ln"][1], state=(M0["W1"], M0["b1"], -U["W1"], -U["b1"]),
                                     mini_batch=4, start=3, precision=FULL)
    assert rel_err(o, o_ttt) <= 1e-5
    for a, b_ in ((M["W1"], W), (M["b1"], b), (U_end["W1"], -dW), (U_end["b1"], -db)):
        assert rel_err(a, b_) <= 1e-5


def test_one_step_from_zero_on_the_whole_sequence_is_linear_attention():
    """Without bias: o_i = q_i W_i, W_i = sum_{j<=i} k_j v_j^T (rate 1 on the half-loss). With a bias, the
    memory also learns b_i = sum_j v_j: linear attention over keys and queries with a constant 1 appended."""
    x = inputs(gradient.Inner("linear", bias=False, norm=False), momentum=False, decay=False, mini_batch=None,
               start=0)
    ones = jnp.ones((B, T, H))
    with jax.default_matmul_precision("highest"):
        reference, _ = linear_recurrent(x["q"], x["k"], x["v"], precision=FULL)
        for bias in (False, True):
            inner = gradient.Inner("linear", bias=bias, norm=False)
            zero = gradient.initial_state(gradient.init_params(inner, H, D, HIDDEN, jax.random.key(0), 0.0), B,
                                          False)
            o, _ = gradient.parallel(x["q"], x["k"], x["v"], inner=inner, theta=ones, state=zero, mini_batch=None)
            if bias:
                pad = lambda y: jnp.concatenate([y, jnp.ones((B, T, H, 1))], -1)  # noqa: E731
                reference, _ = linear_recurrent(pad(x["q"]), pad(x["k"]), x["v"], precision=FULL)
            assert rel_err(o, reference) <= 1e-5


def test_titans_linear_memory_without_momentum_or_forgetting_per_token_is_the_delta_rule():
    inner = gradient.Inner("linear", bias=False, norm=False)
    x = inputs(inner, momentum=False, decay=False, mini_batch=1, start=0)
    k = x["k"] / jnp.linalg.norm(x["k"], axis=-1, keepdims=True)  # unit keys, as the Titans layer makes them
    theta = x["theta"] * D  # up to 1
    zero = gradient.initial_state(gradient.init_params(inner, H, D, HIDDEN, jax.random.key(0), 0.0), B, False)
    with jax.default_matmul_precision("highest"):
        o, (M, _, _, _) = gradient.parallel(x["q"], k, x["v"], inner=inner, theta=theta, state=zero, mini_batch=1)
        delta, S = linear_recurrent(x["q"], k, x["v"], beta=theta, delta=True, precision=FULL)
    assert rel_err(o, delta) <= 1e-5 and rel_err(M["W1"], S) <= 1e-5
