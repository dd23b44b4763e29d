"""MEMIT's many-fact edit against its plain definition and the one-fact edit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tmem.memory.stores import many_edit, rank_one_edit

d_k, d_v = 8, 3


def _setup(E, seed=0):
    keys = jax.random.normal(jax.random.key(seed), (200, d_k))
    C0 = keys.T @ keys / keys.shape[0]  # the preserved keys' uncentred second moment
    S = jax.random.normal(jax.random.key(seed + 1), (d_k, d_v))
    K_E = jax.random.normal(jax.random.key(seed + 2), (E, d_k))
    V_E = jax.random.normal(jax.random.key(seed + 3), (E, d_v))
    return keys, C0, S, K_E, V_E


def test_every_edit_lands_at_lambda_zero_with_independent_keys():
    _, C0, S, K_E, V_E = _setup(E=5)
    np.testing.assert_allclose(K_E @ (S + many_edit(S, K_E, V_E, C0)), V_E, atol=1e-4)


def test_it_is_memits_closed_form_and_the_minimiser_of_its_objective():
    _, C0, S, K_E, V_E = _setup(E=5)
    lam = 0.7
    delta = many_edit(S, K_E, V_E, C0, lam)
    R = V_E - K_E @ S  # the note's layout: Delta_W = R^T K_E (lam C0 + K_E^T K_E)^-1 with W = S^T
    memit = (R.T @ K_E @ jnp.linalg.inv(lam * C0 + K_E.T @ K_E)).T
    np.testing.assert_allclose(delta, memit, atol=1e-4)
    objective = lambda D: lam * jnp.trace(D.T @ C0 @ D) + jnp.sum((K_E @ (S + D) - V_E) ** 2)  # noqa: E731
    np.testing.assert_allclose(jax.grad(objective)(delta), 0, atol=1e-4)
    assert np.abs(K_E @ (S + delta) - V_E).max() > 1e-3  # lam > 0 trades some of the edit for the preserved keys


def test_one_edit_is_the_whitened_rank_one_edit_scaled_by_the_lambda_convention():
    _, C0, S, K_E, V_E = _setup(E=1)
    k, v = K_E[0], V_E[0]
    rank_one = rank_one_edit(S, k, v, C0) - S
    np.testing.assert_allclose(many_edit(S, K_E, V_E, C0), rank_one, atol=1e-4)
    q = k @ jnp.linalg.solve(C0, k)  # k^T C0^-1 k: lam shrinks the edit by q / (lam + q)
    np.testing.assert_allclose(many_edit(S, K_E, V_E, C0, lam=2.0), rank_one * q / (2.0 + q), atol=1e-4)


def test_preserved_keys_move_by_the_computed_amount():
    keys, C0, S, K_E, V_E = _setup(E=3)
    delta = many_edit(S, K_E, V_E, C0)
    # mean squared move of the preserved keys is tr(Delta^T C0 Delta) = tr(R^T (K_E C0^-1 K_E^T)^-1 R) at lam = 0
    R = V_E - K_E @ S
    expected = jnp.trace(R.T @ jnp.linalg.solve(K_E @ jnp.linalg.solve(C0, K_E.T), R))
    assert float(jnp.mean(jnp.sum((keys @ delta) ** 2, -1))) == pytest.approx(float(expected), rel=1e-4)
    # a key conjugate to every edited key (k^T C0^-1 K_E^T = 0) does not move at all
    A = jnp.linalg.solve(C0, K_E.T)  # [d_k, E]
    k = keys[0] - A @ jnp.linalg.solve(A.T @ A, A.T @ keys[0])
    np.testing.assert_allclose(k @ delta, 0, atol=1e-4)
    assert float(jnp.linalg.norm(keys[0] @ delta)) > 1e-3
