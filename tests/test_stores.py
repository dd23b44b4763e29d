"""The writes' exact cases: orthonormal keys, least squares below d_k, delta, RLS, decay, the rank-one edit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tmem.memory.reads import linear_read
from tmem.memory.stores import (add_write, decayed_writes, delta_write, delta_writes, hebbian_write, lstsq_write,
                                rank_one_edit, rls_init, rls_writes)


def random(shape, seed=0):
    return jax.random.normal(jax.random.key(seed), shape)


def orthonormal(M, d, seed=0):
    q, _ = jnp.linalg.qr(random((d, d), seed))
    return q[:M]


def unit(x):
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def test_hebbian_recalls_orthonormal_keys_exactly_and_random_keys_with_interference():
    d, M = 8, 8
    K, V = orthonormal(M, d), random((M, 5), 1)
    np.testing.assert_allclose(linear_read(hebbian_write(K, V), K), V, atol=1e-5)
    K_rand = unit(random((M, d), 2))
    assert np.abs(linear_read(hebbian_write(K_rand, V), K_rand) - V).max() > 0.1


def test_hebbian_store_is_the_sum_of_single_writes():
    K, V = random((6, 4)), random((6, 3), 1)
    S = jnp.zeros((4, 3))
    for k, v in zip(K, V):
        S = add_write(S, k, v)
    np.testing.assert_allclose(S, hebbian_write(K, V), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("M", [1, 5, 8])
def test_least_squares_is_exact_up_to_d_k_keys(M):
    K, V = random((M, 8)), random((M, 3), 1)  # random, not orthogonal, keys
    np.testing.assert_allclose(linear_read(lstsq_write(K, V), K), V, atol=1e-4)


def test_least_squares_beyond_d_k_solves_the_normal_equations():
    K, V = random((20, 6)), random((20, 3), 1)
    S = lstsq_write(K, V)
    np.testing.assert_allclose(S, np.linalg.lstsq(np.asarray(K), np.asarray(V), rcond=None)[0], atol=1e-4)
    assert np.abs(linear_read(S, K) - V).max() > 0.1  # 20 pairs in 6 dimensions cannot all be exact


def test_delta_write_stores_a_unit_key_exactly_and_beta_zero_writes_nothing():
    S = random((6, 4))
    k, v = unit(random((6,), 1)), random((4,), 2)
    np.testing.assert_allclose(linear_read(delta_write(S, k, v, 1.0), k), v, atol=1e-5)
    np.testing.assert_array_equal(delta_write(S, k, v, 0.0), S)


def test_delta_write_is_the_erase_then_write_form_of_the_mixers():
    # (I - beta k k^T) S + beta k v^T: the key-major delta recurrence of the fast-weight mixers
    S, k, v, beta = random((6, 4)), unit(random((6,), 1)), random((4,), 2), 0.3
    expected = (jnp.eye(6) - beta * jnp.outer(k, k)) @ S + beta * jnp.outer(k, v)
    np.testing.assert_allclose(delta_write(S, k, v, beta), expected, rtol=1e-5, atol=1e-6)


def test_delta_writes_of_orthonormal_keys_equal_the_hebbian_store():
    K, V = orthonormal(5, 8), random((5, 3), 1)
    np.testing.assert_allclose(delta_writes(jnp.zeros((8, 3)), K, V), hebbian_write(K, V), atol=1e-5)


def test_recursive_least_squares_equals_the_batch_ridge_store():
    K, V, ridge = random((30, 5)), random((30, 3), 1), 0.5
    S, R = rls_writes(rls_init(5, 3, ridge), K, V)
    np.testing.assert_allclose(S, lstsq_write(K, V, ridge=ridge), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(R, np.linalg.inv(np.asarray(K.T @ K) + ridge * np.eye(5)), rtol=1e-4, atol=1e-6)


def test_decayed_writes_are_the_hebbian_store_of_keys_scaled_by_gamma_to_their_age():
    K, V, gamma = random((7, 5)), random((7, 3), 1), 0.8
    age = jnp.arange(6, -1, -1)  # the last pair written has age 0
    want = hebbian_write(K * gamma ** age[:, None], V)
    np.testing.assert_allclose(decayed_writes(jnp.zeros((5, 3)), K, V, gamma), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(decayed_writes(jnp.zeros((5, 3)), K, V, 1.0), hebbian_write(K, V), rtol=1e-5, atol=1e-6)
    gates = jnp.linspace(0.5, 1.0, 7)  # one gate per write: pair i keeps the product of the later gates
    kept = jnp.array([jnp.prod(gates[i + 1:]) for i in range(7)])
    np.testing.assert_allclose(decayed_writes(jnp.zeros((5, 3)), K, V, gates), hebbian_write(K * kept[:, None], V),
                               rtol=1e-5, atol=1e-6)


def _edit_setup(d=6, seed=0):
    keys = random((200, d), seed) * jnp.linspace(0.3, 2.0, d)[None]  # anisotropic keys, so C differs from I
    C = keys.T @ keys / keys.shape[0]
    S, k_star, v_star = random((d, 4), seed + 1), random((d,), seed + 2), random((4,), seed + 3)
    return C, S, k_star, v_star


def _project_out(x, direction):
    return x - ((x @ direction) / (direction @ direction))[:, None] * direction[None]


def test_whitened_edit_writes_the_fact_and_spares_keys_conjugate_to_it():
    C, S, k_star, v_star = _edit_setup()
    edited = rank_one_edit(S, k_star, v_star, C)
    np.testing.assert_allclose(linear_read(edited, k_star), v_star, rtol=1e-4, atol=1e-4)
    w = jnp.linalg.solve(C, k_star)
    conjugate = _project_out(random((10, 6), 9), w)  # k^T C^-1 k* = 0
    np.testing.assert_allclose(linear_read(edited, conjugate), linear_read(S, conjugate), rtol=1e-4, atol=1e-4)
    orthogonal = _project_out(random((10, 6), 9), k_star)  # orthogonal to k*, but not conjugate
    assert np.abs(linear_read(edited, orthogonal) - linear_read(S, orthogonal)).max() > 1e-2


def test_plain_edit_writes_the_fact_and_spares_keys_orthogonal_to_it():
    C, S, k_star, v_star = _edit_setup()
    edited = rank_one_edit(S, k_star, v_star)
    np.testing.assert_allclose(linear_read(edited, k_star), v_star, rtol=1e-4, atol=1e-4)
    orthogonal = _project_out(random((10, 6), 9), k_star)
    np.testing.assert_allclose(linear_read(edited, orthogonal), linear_read(S, orthogonal), rtol=1e-4, atol=1e-4)
    conjugate = _project_out(random((10, 6), 9), jnp.linalg.solve(C, k_star))
    assert np.abs(linear_read(edited, conjugate) - linear_read(S, conjugate)).max() > 1e-2


def test_whitened_edit_is_the_least_change_in_the_keys_metric():
    C, S, k_star, v_star = _edit_setup()
    cost = lambda S2: float(jnp.trace((S2 - S).T @ C @ (S2 - S)))  # noqa: E731  tr(Delta C Delta^T), key-major
    whitened, plain = rank_one_edit(S, k_star, v_star, C), rank_one_edit(S, k_star, v_star)
    assert cost(whitened) < cost(plain)
