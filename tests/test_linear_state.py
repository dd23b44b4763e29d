"""The note's invariants of the fast-weight write (Chapters 9 and 10), in both forms.

Gated delta with alpha = 1 equals delta is tested on the layers (tests/test_fast_weight.py)."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tmem.memory.chunked import chunked
from tmem.memory.linear_state import recurrent

FULL = jax.lax.Precision.HIGHEST  # exact stores and equalities hold in full float32
FORMS = {"recurrent": jax.jit(partial(recurrent, precision=FULL), static_argnames="delta"),
         "chunked": jax.jit(partial(chunked, chunk=3, precision=FULL), static_argnames="delta")}
B, T, H, DK, DV = 2, 7, 2, 4, 3


def unit(x):
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def random(seed, *shape):
    return jax.random.normal(jax.random.key(seed), shape)


@pytest.mark.parametrize("form", FORMS)
def test_delta_write_with_unit_key_and_full_strength_stores_the_pair_exactly(form):
    """With beta = 1 and |k| = 1, S_t^T k_t = v_t after the write, whatever was stored before."""
    k, v = unit(random(1, B, T, H, DK)), random(2, B, T, H, DV)
    S0 = random(3, B, H, DK, DV)
    for log_a in (None, jax.nn.log_sigmoid(random(4, B, T, H, 1))):
        # reading with q_t = k_t right after each write returns v_t
        o, S = FORMS[form](k, k, v, log_a=log_a, beta=jnp.ones((B, T, H)), delta=True, state=S0)
        np.testing.assert_allclose(o, v, atol=2e-5)
        np.testing.assert_allclose(jnp.einsum("bhk,bhkv->bhv", k[:, -1], S), v[:, -1], atol=2e-5)
    # the check can fail: the add rule keeps what was stored under k_t
    o, _ = FORMS[form](k, k, v, state=S0)
    assert not np.allclose(o, v, atol=1e-2)


@pytest.mark.parametrize("form", FORMS)
def test_zero_write_strength_writes_nothing(form):
    q, k, v = random(1, B, T, H, DK), unit(random(2, B, T, H, DK)), random(3, B, T, H, DV)
    S0 = random(4, B, H, DK, DV)
    o, S = FORMS[form](q, k, v, beta=jnp.zeros((B, T, H)), delta=True, state=S0)
    np.testing.assert_allclose(S, S0, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(o, jnp.einsum("bthk,bhkv->bthv", q, S0), rtol=1e-5, atol=1e-5)


def quadratic(q, k, v, log_a=None):
    """Chapter 9's masked form: o_t = sum_{s<=t} (q_t . (k_s * prod_{s<r<=t} a_r)) v_s."""
    scores = jnp.einsum("bthk,bshk->bhts", q, k)
    if log_a is not None:  # a scalar decay per head: prod_{s<r<=t} a_r = exp(b_t - b_s)
        b = jnp.cumsum(log_a[..., 0], axis=1)
        diff = jnp.moveaxis(b, 1, -1)[..., :, None] - jnp.moveaxis(b, 1, -1)[..., None, :]
        scores = scores * jnp.exp(jnp.where(jnp.tril(jnp.ones((T, T), bool)), diff, -jnp.inf))
    scores = jnp.where(jnp.tril(jnp.ones((T, T), bool)), scores, 0.0)
    return jnp.einsum("bhts,bshv->bthv", scores, v)


@pytest.mark.parametrize("form", FORMS)
def test_causal_linear_attention_equals_its_quadratic_masked_form(form):
    q, k, v = random(1, B, T, H, DK), random(2, B, T, H, DK), random(3, B, T, H, DV)
    np.testing.assert_allclose(FORMS[form](q, k, v)[0], quadratic(q, k, v), rtol=1e-5, atol=1e-5)
    log_a = jax.nn.log_sigmoid(random(4, B, T, H, 1))
    np.testing.assert_allclose(FORMS[form](q, k, v, log_a=log_a)[0], quadratic(q, k, v, log_a), rtol=1e-5, atol=1e-5)
    # the normaliser is a value column of ones: its read is sum_{s<=t} q_t . k_s
    phi_q, phi_k = jax.nn.elu(q) + 1, jax.nn.elu(k) + 1
    ones = jnp.ones((B, T, H, 1))
    o = FORMS[form](phi_q, phi_k, jnp.concatenate([v, ones], -1))[0]
    np.testing.assert_allclose(o[..., :DV] / o[..., DV:], quadratic(phi_q, phi_k, v) / quadratic(phi_q, phi_k, ones),
                               rtol=1e-5, atol=1e-5)


def test_a_wrongly_shaped_decay_is_refused():
    q = random(1, B, T, H, DK)
    with pytest.raises(ValueError, match="log_a must be"):
        recurrent(q, q, q, log_a=jnp.zeros((B, T, H, 2)))
