"""Interference against signal: the measurement's split, its padding, the search, the theory."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tmem.memory.capacity import (STORES, capacity_formula, capacity_theory, find_capacity, interference_ratio,
                                  recall, score_moment, split_recall, unit_dot_moment)


def test_unit_dot_moments_match_the_beta_law_and_quadrature():
    d = 64
    assert unit_dot_moment(d, 1) == pytest.approx(1 / d)
    assert unit_dot_moment(d, 2) == pytest.approx(3 / (d * (d + 2)))
    assert unit_dot_moment(d, 3) == pytest.approx(15 / (d * (d + 2) * (d + 4)))
    for p in (1, 2, 3):
        assert score_moment(lambda s, p=p: np.asarray(s) ** p, d) == pytest.approx(unit_dot_moment(d, p), rel=1e-9)
    # and a Monte Carlo draw of unit vectors agrees
    x = np.random.default_rng(0).standard_normal((200_000, 8))
    s = x[:, 0] / np.linalg.norm(x, axis=1)
    assert np.mean(s**4) == pytest.approx(unit_dot_moment(8, 2), rel=0.03)


def test_theory_is_the_exact_moment_form_and_the_formula_the_notes():
    d = 64
    assert capacity_theory("hebbian", d) == pytest.approx(d + 1)
    assert capacity_theory("relu", d) == pytest.approx(2 * d + 1)
    assert capacity_theory("relu2", d) == pytest.approx(2 * d * (d + 2) / 3 + 1)
    assert capacity_theory("relu3", d) == pytest.approx(2 * d * (d + 2) * (d + 4) / 15 + 1)
    assert capacity_theory("lstsq", d) == 2 * d - 2
    assert capacity_formula("relu3", d) == pytest.approx(2 * d**3 / 15)
    # softmax: 1 + e^2beta / E[e^2beta s]; for beta << d the Gaussian form e^(2 beta (1 - beta/d)) is close
    beta = 3.0
    assert capacity_theory("softmax", 4096, beta) == pytest.approx(capacity_formula("softmax", 4096, beta), rel=0.01)
    assert capacity_theory("softmax", 16, 4.0) > capacity_formula("softmax", 16, 4.0) * 1.1  # and far off at beta = sqrt(d)


@pytest.mark.parametrize("store", list(STORES))
def test_padded_rows_change_nothing(store):
    """A store of M pairs drawn with N > M rows reads like the M pairs alone."""
    M, N, d, n_q = 5, 12, 4, 3
    X = jax.random.normal(jax.random.key(3), (N, 2 * d))
    got = split_recall(store, X[:, :d], X[:, d:], M, n_q, 2.0)
    K = X[:M, :d] / jnp.linalg.norm(X[:M, :d], axis=-1, keepdims=True)
    V = X[:M, d:] / jnp.linalg.norm(X[:M, d:], axis=-1, keepdims=True)
    if store == "lstsq":  # the padded form carries a 1e-6 ridge
        out = K[:n_q] @ jnp.linalg.solve(K.T @ K + 1e-6 * jnp.eye(d), K.T @ V)
    else:
        out = recall(store, K, V, K[:n_q], 2.0)
    weights = recall(store, K, jnp.eye(M), K[:n_q], 2.0)  # read with one-hot values: each value's weight
    w_self = jnp.diagonal(weights[:, :n_q]) if store != "lstsq" else jnp.diagonal(
        K[:n_q] @ jnp.linalg.solve(K.T @ K + 1e-6 * jnp.eye(d), K.T))
    signal = w_self[:, None] * V[:n_q]
    ratio2 = jnp.sum((out - signal) ** 2, -1) / jnp.sum(signal**2, -1)
    np.testing.assert_allclose(got, (ratio2.sum(), n_q), rtol=2e-3)


def test_orthonormal_case_and_least_squares_below_d_k_have_no_interference():
    key = jax.random.key(0)
    assert interference_ratio("lstsq", key, 6, 8, queries=64) < 1e-2
    assert interference_ratio("hebbian", key, 1, 8, queries=16) < 1e-6


def test_hebbian_ratio_grows_like_sqrt_of_m_over_d():
    d = 16
    for M in (8, 32):
        assert interference_ratio("hebbian", jax.random.key(1), M, d, queries=1024) == pytest.approx(
            math.sqrt((M - 1) / d), rel=0.06)


def test_search_finds_the_crossing_from_either_side():
    exact = lambda M: math.sqrt((M - 1) / 100.0)  # noqa: E731  crosses 1 at M = 101
    for start in (2, 64, 5000):
        capacity, seen = find_capacity(exact, start=start, rtol=0.01)
        assert capacity == pytest.approx(101, rel=0.01)
        assert len(seen) < 25
    assert find_capacity(lambda M: 2.0, start=8)[0] == 2.0  # at capacity already with two pairs


@pytest.mark.parametrize("store", ["hebbian", "relu2", "softmax"])
def test_measured_capacity_is_near_theory_at_small_width(store):
    d, beta = 8, 2.0
    capacity, _ = find_capacity(lambda M: interference_ratio(store, jax.random.key(2), M, d, beta=beta,
                                                             queries=2048), start=d)
    assert capacity == pytest.approx(capacity_theory(store, d, beta), rel=0.15)
