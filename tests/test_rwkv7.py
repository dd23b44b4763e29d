"""RWKV-7 (tmem/memory/rwkv7.py, tmem/mixers/rwkv7.py): the token scan against the note's value-major recurrence,
the chunked form against the token scan in outputs, final state and gradients, and the layer against a
written-out definition."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import quick_only
from tmem.memory import rwkv7
from tmem.mixers.rwkv7 import RWKV7, SHIFTED, RWKV7Config, RWKV7Run

HIGHEST = jax.lax.Precision.HIGHEST


def inputs(B=2, T=11, H=2, dk=4, dv=3, seed=0):
    """r, log w within RWKV-7's (-e^{-1/2}, 0), a unit removal key, a in (0, 1), kt, v; and a state."""
    k = jax.random.split(jax.random.key(seed), 7)
    r, kt = jax.random.normal(k[0], (B, T, H, dk)), jax.random.normal(k[4], (B, T, H, dk))
    log_w = -np.exp(-0.5) * jax.nn.sigmoid(2 * jax.random.normal(k[1], (B, T, H, dk)))
    kh = jax.random.normal(k[2], (B, T, H, dk))
    kh = kh / jnp.linalg.norm(kh, axis=-1, keepdims=True)
    a = jax.nn.sigmoid(jax.random.normal(k[3], (B, T, H, dk)))
    v = jax.random.normal(k[5], (B, T, H, dv))
    return (r, log_w, kh, a, kt, v), jax.random.normal(k[6], (B, H, dk, dv))


def value_major(r, log_w, kh, a, kt, v, S0):
    """The issue's recurrence in float64, the note's layout: S_t = S_{t-1} (Diag(w_t) - kh_t (a_t kh_t)^T)
    + v_t kt_t^T, o_t = S_t r_t, with S [d_v, d_k]."""
    r, w, kh, a, kt, v = (np.asarray(y, np.float64) for y in (r, np.exp(log_w), kh, a, kt, v))
    B, T, H, _ = v.shape
    o = np.zeros(v.shape)
    S = np.swapaxes(np.asarray(S0, np.float64), -1, -2).copy()
    for b in range(B):
        for h in range(H):
            for t in range(T):
                S[b, h] = S[b, h] @ (np.diag(w[b, t, h]) - np.outer(kh[b, t, h], a[b, t, h] * kh[b, t, h]))
                S[b, h] += np.outer(v[b, t, h], kt[b, t, h])
                o[b, t, h] = S[b, h] @ r[b, t, h]
    return o, np.swapaxes(S, -1, -2)


def test_the_token_scan_is_the_value_major_recurrence_transposed():
    args, S0 = inputs()
    o, final = rwkv7.recurrent(*args, state=S0, precision=HIGHEST)
    want_o, want_final = value_major(*args, S0)
    np.testing.assert_allclose(o, want_o, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(final, want_final, rtol=1e-5, atol=1e-5)


# the quick subset: several chunks from a state; the rest compile for a minute on a shared 2-core CPU
@pytest.mark.parametrize("chunk,from_state", quick_only([(4, False), (4, True), (16, False), (16, True)], {"4-True"},
                                                        ids=lambda c: f"{c[0]}-{c[1]}"))
def test_the_chunked_form_equals_the_token_scan_in_outputs_state_and_gradients(chunk, from_state):
    """11 tokens in chunks of 4 (no chunk divides them) and in one chunk of 16, from a state and from none;
    the gradient of every input (and of the state entering) through the reads and the final state."""
    args, S0 = inputs()
    weights = jax.random.normal(jax.random.key(9), args[-1].shape), jax.random.normal(jax.random.key(8), S0.shape)

    def loss(form, *args_and_state):
        *xs, state = args_and_state
        o, final = form(*xs, state=state if from_state else None, precision=HIGHEST)
        return jnp.sum(o * weights[0]) + jnp.sum(final * weights[1])

    chunked = lambda *a, **kw: rwkv7.chunked(*a, chunk=chunk, **kw)  # noqa: E731
    state = S0 if from_state else None
    # each jitted whole: one program compiles sooner than its operations one by one
    (o1, f1), (o2, f2) = (jax.jit(partial(form, state=state, precision=HIGHEST))(*args)
                          for form in (rwkv7.recurrent, chunked))
    np.testing.assert_allclose(o2, o1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(f2, f1, rtol=1e-5, atol=1e-5)
    g1, g2 = (jax.jit(jax.grad(partial(loss, form), argnums=tuple(range(7))))(*args, S0)
              for form in (rwkv7.recurrent, chunked))
    for name, a, b in zip(("r", "log_w", "kh", "a", "kt", "v", "state"), g1, g2):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4, err_msg=name)


@pytest.mark.slow  # the continuation tests (tests/test_continuation.py) hold the layer to it too
def test_continuing_from_a_state_equals_one_pass():
    args, _ = inputs(T=13)
    chunked = jax.jit(partial(rwkv7.chunked, chunk=4, precision=HIGHEST))  # sooner than operation by operation
    o, final = chunked(*args)
    first, state = chunked(*(y[:, :6] for y in args))
    rest, end = chunked(*(y[:, 6:] for y in args), state=state)
    np.testing.assert_allclose(jnp.concatenate([first, rest], 1), o, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(end, final, rtol=1e-5, atol=1e-5)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def definition(layer: RWKV7, x):
    """The layer in float64 from its parameters: token shift, r k v, the decay, rate, removal and replacement
    keys, the value-major recurrence, the group norm per head, the bonus, the gate and the output map."""
    P = lambda a: np.asarray(a[...], np.float64)  # noqa: E731
    x = np.asarray(x, np.float64)
    Bn, T, D = x.shape
    H, d = layer.cfg.heads, layer.d_head
    prev = np.concatenate([np.zeros((Bn, 1, D)), x[:, :-1]], 1)
    xs = {name: x + P(layer.mix)[i] * (prev - x) for i, name in enumerate(SHIFTED)}
    lin = lambda m, y: y @ P(m.kernel)  # noqa: E731
    heads = lambda y: y.reshape(*y.shape[:-1], H, d)  # noqa: E731
    r, k, v = heads(lin(layer.r, xs["r"])), heads(lin(layer.k, xs["k"])), heads(lin(layer.v, xs["v"]))
    w_logit = P(layer.w0) + lin(layer.w_up, np.tanh(lin(layer.w_down, xs["w"])))
    log_w = heads(-np.exp(-0.5) * sigmoid(w_logit))
    a = heads(sigmoid(P(layer.a0) + lin(layer.a_up, lin(layer.a_down, xs["a"]))))
    kk = k * heads(P(layer.k_k))
    kh = kk / np.sqrt(np.sum(kk ** 2, -1, keepdims=True) + 1e-6)
    kt = k * (1 + (a - 1) * heads(P(layer.k_a)))
    o, _ = value_major(r, log_w, kh, a, kt, v, np.zeros((Bn, H, d, d)))
    o = (o - o.mean(-1, keepdims=True)) / np.sqrt(o.var(-1, keepdims=True) + 1e-5 * d)
    o = o * P(layer.norm_scale) + P(layer.norm_bias) + np.sum(r * P(layer.rho) * kt, -1, keepdims=True) * v
    g = lin(layer.g_up, sigmoid(lin(layer.g_down, xs["g"])))
    return (o.reshape(Bn, T, D) * g) @ P(layer.out.kernel)


@pytest.mark.parametrize("form", quick_only(list(rwkv7.FORMS), {"recurrent"}))
def test_the_layer_equals_its_written_out_definition(form):
    layer = RWKV7(RWKV7Config(run=RWKV7Run(form, chunk=4), rank=3), 8, rope=False, rngs=nnx.Rngs(0))
    for i, name in enumerate(("w_up", "a_up", "rho", "a0")):  # zero at initialisation: give them values to test
        param = getattr(layer, name)
        param = param.kernel if hasattr(param, "kernel") else param
        param[...] = 0.5 * jax.random.normal(jax.random.key(20 + i), param[...].shape)
    x = jax.random.normal(jax.random.key(1), (2, 7, 8))
    with jax.default_matmul_precision("highest"):
        y, state = layer(x)
    np.testing.assert_allclose(y, definition(layer, x), rtol=1e-4, atol=1e-5)
    assert state.memory.shape == (2, 4, 2, 2) and state.length == 7  # four heads of 2


def test_the_decay_biases_state_size_and_heads():
    """The decay's biases spread as the reference's first layer; the state is each head's matrix and one token."""
    layer = RWKV7(RWKV7Config(), 16, rope=False, rngs=nnx.Rngs(0))
    w0 = layer.w0[...]
    assert float(w0.min()) == pytest.approx(-6.5) and float(w0.max()) == pytest.approx(-1.5)
    assert RWKV7Config().state_size(64, 64) == 4 * 16 * 16 + 64
    with pytest.raises(ValueError, match="mixer.heads=3 must divide model.width=64"):
        RWKV7Config(heads=3).check(64)
