"""Mamba-1 (tmem/memory/selective.py, tmem/mixers/mamba.py): the layer against a written-out definition, and the
associative scan against the token scan in outputs, final state and gradients."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import quick_only
from tmem.memory import selective
from tmem.mixers.mamba import Mamba, MambaConfig, MambaRun

HIGHEST = jax.lax.Precision.HIGHEST


def silu(x):
    return x / (1 + np.exp(-x))


def definition(layer: Mamba, x):
    """The block one token at a time in float64 from the layer's parameters: in-projection to x and z, conv1d
    with its bias and SiLU on x, dt = softplus(W_dt (W_low x) + b), B and C from x,
    S_t = exp(dt_t A) * S_{t-1} + (dt_t x_t) B_t^T per channel, y_t = S_t C_t + D x_t, y silu(z), out-projection."""
    cfg, P = layer.cfg, lambda a: np.asarray(a[...], np.float64)  # noqa: E731
    x = np.asarray(x, np.float64)
    Bn, T, _ = x.shape
    d, N, K = layer.d_inner, cfg.d_state, cfg.short_conv
    xz = x @ P(layer.in_proj.kernel)
    xs, z = xz[..., :d], xz[..., d:]
    padded = np.concatenate([np.zeros((Bn, K - 1, d)), xs], 1)
    xs = silu(sum(P(layer.conv.kernel)[i] * padded[:, i:i + T] for i in range(K)) + P(layer.conv.bias))
    proj = xs @ P(layer.x_proj.kernel)
    low, Bm, Cm = proj[..., :-2 * N], proj[..., -2 * N:-N], proj[..., -N:]
    dt = np.log1p(np.exp(low @ P(layer.dt_proj.kernel) + P(layer.dt_proj.bias)))
    A = -np.exp(P(layer.A_log))
    y = np.zeros((Bn, T, d))
    for b in range(Bn):
        S = np.zeros((d, N))
        for t in range(T):
            S = np.exp(dt[b, t][:, None] * A) * S + np.outer(dt[b, t] * xs[b, t], Bm[b, t])
            y[b, t] = S @ Cm[b, t] + P(layer.D) * xs[b, t]
    return (y * silu(z)) @ P(layer.out.kernel)


@pytest.mark.parametrize("form", quick_only(list(selective.FORMS), {"scan"}))
def test_the_layer_equals_its_written_out_definition(form):
    layer = Mamba(MambaConfig(run=MambaRun(form), d_state=4), 8, rope=False, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (2, 7, 8))
    with jax.default_matmul_precision("highest"):
        y, state = layer(x)
    np.testing.assert_allclose(y, definition(layer, x), rtol=1e-4, atol=1e-5)
    assert state.memory.shape == (2, 16, 4) and state.length == 7


def inputs(B=2, T=13, d=5, N=3, seed=0):
    k = jax.random.split(jax.random.key(seed), 6)
    x, dt = jax.random.normal(k[0], (B, T, d)), jax.nn.softplus(jax.random.normal(k[1], (B, T, d)))
    A = -jnp.exp(jax.random.normal(k[2], (d, N)))
    Bm, Cm = jax.random.normal(k[3], (B, T, N)), jax.random.normal(k[4], (B, T, N))
    return (x, dt, A, Bm, Cm), jax.random.normal(k[5], (B, d, N))


@pytest.mark.parametrize("from_state", quick_only([False, True], {"True"}))
def test_the_associative_scan_equals_the_token_scan_in_outputs_state_and_gradients(from_state):
    """Every input's gradient, through the read and the final state, at a length (13) no power of two divides."""
    args, S0 = inputs()
    state = S0 if from_state else None
    weights = jax.random.normal(jax.random.key(9), (2, 13, 5)), jax.random.normal(jax.random.key(8), S0.shape)

    def loss(form, *args):
        y, final = form(*args, state=state, precision=HIGHEST)
        return jnp.sum(y * weights[0]) + jnp.sum(final * weights[1])

    # each jitted whole: one program compiles sooner than its operations one by one
    (y1, f1), (y2, f2) = (jax.jit(partial(form, state=state, precision=HIGHEST))(*args)
                          for form in (selective.scan, selective.parallel))
    np.testing.assert_allclose(y2, y1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(f2, f1, rtol=1e-5, atol=1e-5)
    g1, g2 = (jax.jit(jax.grad(partial(loss, form), argnums=(0, 1, 2, 3, 4)))(*args)
              for form in (selective.scan, selective.parallel))
    for a, b in zip(g1, g2):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("form", list(selective.FORMS.values()), ids=list(selective.FORMS))
def test_reads_at_positions_and_continuing_from_a_state_equal_one_pass(form):
    (x, dt, A, Bm, Cm), _ = inputs()
    y, final = form(x, dt, A, Bm, Cm, precision=HIGHEST)
    at = jnp.array([[0, 6, 12], [3, 4, 9]])
    np.testing.assert_allclose(form(x, dt, A, Bm, Cm, read_at=at, precision=HIGHEST)[0],
                               jnp.take_along_axis(y, at[..., None], axis=1), rtol=1e-5, atol=1e-6)
    first, state = form(x[:, :5], dt[:, :5], A, Bm[:, :5], Cm[:, :5], precision=HIGHEST)
    rest, end = form(x[:, 5:], dt[:, 5:], A, Bm[:, 5:], Cm[:, 5:], state=state, precision=HIGHEST)
    np.testing.assert_allclose(jnp.concatenate([first, rest], 1), y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(end, final, rtol=1e-5, atol=1e-5)


def test_the_initialisation_is_the_reference():
    """A_log = log(1..N) in every channel (S4D-real) and dt = softplus(bias) within the reference's [1e-3, 1e-1]."""
    layer = Mamba(MambaConfig(), 16, rope=False, rngs=nnx.Rngs(0))
    np.testing.assert_allclose(jnp.exp(layer.A_log[...]), jnp.broadcast_to(jnp.arange(1.0, 17.0), (32, 16)),
                               rtol=1e-6)
    dt = jax.nn.softplus(layer.dt_proj.bias[...])
    assert dt.shape == (32,) and float(dt.min()) >= 1e-3 * (1 - 1e-4) and float(dt.max()) <= 1e-1 * (1 + 1e-4)
    assert MambaConfig().rank(64) == 4 and MambaConfig().state_size(64, 64) == 128 * 16 + 3 * 128


def test_a_range_draws_each_entry_of_a_within_it():
    """mixer.a_range: -A per (channel, state) entry from U(low, high), not S4D-real; a range that is no range is
    refused in one line."""
    A = jnp.exp(Mamba(MambaConfig(a_range=(0.1, 1.0)), 16, rope=False, rngs=nnx.Rngs(0)).A_log[...])
    assert A.shape == (32, 16) and float(A.min()) >= 0.1 and float(A.max()) <= 1.0
    assert len(np.unique(np.asarray(A))) == A.size  # every entry its own draw
    with pytest.raises(ValueError, match=r"mixer.a_range=\[1.0, 0.1\] must be \[low, high\]"):
        MambaConfig(a_range=(1.0, 0.1)).check(64)


def test_dt_range_draws_each_channels_initial_step_within_it():
    """mixer.dt_range: dt = softplus(bias) ~ logU(low, high) per channel; a range that is no range is refused."""
    dt = jax.nn.softplus(Mamba(MambaConfig(dt_range=(1e-2, 1e-1)), 16, rope=False, rngs=nnx.Rngs(0)).dt_proj.bias[...])
    assert float(dt.min()) >= 1e-2 * (1 - 1e-4) and float(dt.max()) <= 1e-1 * (1 + 1e-4)
    assert float(dt.min()) < 2e-2 and float(dt.max()) > 5e-2  # spread over the range, not at one end
    with pytest.raises(ValueError, match=r"mixer.dt_range=\[0.1, 0.01\] must be \[low, high\]"):
        MambaConfig(dt_range=(0.1, 0.01)).check(64)


def test_a_bad_form_is_refused_in_one_line():
    with pytest.raises(ValueError, match="mixer.run.form='chunked' is not one of: parallel, scan"):
        MambaConfig(run=MambaRun("chunked")).check(64)
