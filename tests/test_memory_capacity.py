"""Interference against signal: the measurement's split, its padding, the search, the theory;
the written stores (delta, RLS, decayed): their queries by age, RLS against least squares, the decayed
store's exact-moment theory, the delta rule's exact facts."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import quick_only
from tmem.memory.capacity import (MAX_FEATURES, STORES, WRITTEN, capacity_formula, capacity_theory, end_ratios,
                                  find_capacity, interference_ratio, recall, score_moment, split_recall,
                                  theory_ratio, unit_dot_moment)
from tmem.memory.capacity_writes import (check_knob, decayed_age_ratio, decayed_capacity, decayed_horizon,
                                         decayed_ratio, query_rows)
from tmem.memory.reads import linear_read
from tmem.memory.stores import lstsq_write


def unit(x):
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


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


@pytest.mark.parametrize("store", quick_only(list(STORES), {"hebbian", "softmax", "delta"}))
def test_padded_rows_change_nothing(store):
    """A store of M pairs drawn with N > M rows reads like the M pairs alone."""
    M, N, d, n_q = 5, 12, 4, 3
    knob = {"delta": 0.5, "rls": 0.1, "decayed": 0.9}.get(store, 2.0)
    offsets = jnp.array([0.1, 0.5, 0.9])  # a written store's queries: rows 0, 2, 4 (one per band of 5/3 ages)
    X = jax.random.normal(jax.random.key(3), (N, 2 * d))
    key = jax.random.key(4) if store == "performer" else None  # its features, the same for both reads
    got = split_recall(store, X[:, :d], X[:, d:], M, n_q, knob, offsets, key)
    K, V = unit(X[:M, :d]), unit(X[:M, d:])
    rows = jnp.array([0, 2, 4]) if store in WRITTEN else jnp.arange(n_q)
    if store == "lstsq":  # the padded form carries a 1e-6 ridge
        out = K[rows] @ jnp.linalg.solve(K.T @ K + 1e-6 * jnp.eye(d), K.T @ V)
    else:
        out = recall(store, K, V, K[rows], knob, key)
    weights = recall(store, K, jnp.eye(M), K[rows], knob, key)  # read with one-hot values: each value's weight
    w_self = weights[jnp.arange(n_q), rows] if store != "lstsq" else jnp.diagonal(
        K[:n_q] @ jnp.linalg.solve(K.T @ K + 1e-6 * jnp.eye(d), K.T))
    signal = w_self[:, None] * V[rows]
    ratio2 = jnp.sum((out - signal) ** 2, -1) / jnp.sum(signal**2, -1)
    np.testing.assert_allclose(got, (ratio2.sum(), n_q), rtol=2e-3)


@pytest.mark.slow  # the estimator itself is tested quick in tests/test_features.py
def test_the_random_feature_store_estimates_the_exponential_read_and_interferes_less_with_more_features():
    """Read with one-hot values, the store's weights of m features average, over 400 draws of its features, to
    m / MAX_FEATURES times the exponential read's exp(beta k.q) at beta = sqrt(d): standardised misses of RMS
    about 1; and at 64 stored pairs its ratio falls as m grows
    (15, 5.3, 2.1, 1.2 measured for m = 16, 64, 256, 1024), towards the exponential read's 0.37."""
    d, m = 8, 256
    K = unit(jax.random.normal(jax.random.key(1), (12, d)))
    draws = jax.vmap(lambda key: recall("performer", K, jnp.eye(12), K[:4], m, key))(
        jax.random.split(jax.random.key(2), 400))
    exact = jnp.exp(math.sqrt(d) * K[:4] @ K.T) * m / MAX_FEATURES
    z = (draws.mean(0) - exact) / (draws.std(0) / math.sqrt(draws.shape[0]))
    assert float(jnp.sqrt(jnp.mean(z ** 2))) < 1.5
    ratios = [interference_ratio("performer", jax.random.key(0), 64, 16, knob=m) for m in (16, 64, 256, 1024)]
    assert ratios == sorted(ratios, reverse=True) and ratios[-1] < 1.5 < 4 < ratios[1]


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
    capacity, _ = find_capacity(lambda M: interference_ratio(store, jax.random.key(2), M, d, knob=beta,
                                                             queries=2048), start=d)
    assert capacity == pytest.approx(capacity_theory(store, d, beta), rel=0.15)


# -- the written stores ----------------------------------------------------------


def test_written_stores_query_every_age_equally_often_and_both_ends():
    rows = np.asarray(query_rows(5, 8, jnp.zeros(8)))
    assert rows.tolist() == list(range(8)) + [0, 4]  # up to n_q pairs: every row (past M not pooled), the ends
    draws = jax.random.uniform(jax.random.key(0), (4000, 4))
    rows = np.asarray(jax.vmap(lambda u: query_rows(10, 4, u))(draws))
    assert (rows[:, -2:] == [0, 9]).all()
    assert all((r[:4] >= np.floor(np.arange(4) * 2.5)).all() and (r[:4] < np.ceil(np.arange(1, 5) * 2.5)).all()
               for r in rows)  # one query in each band of 2.5 ages
    counts = np.bincount(rows[:, :4].ravel(), minlength=10)
    np.testing.assert_allclose(counts, 4000 * 4 / 10, rtol=0.08)  # and every age equally often


def test_knobs_outside_their_range_are_refused():
    for store, knob in (("delta", 2.0), ("delta", 0.0), ("rls", 0.0), ("decayed", 1.5), ("decayed", 0.0)):
        with pytest.raises(ValueError, match=f"{store}: "):
            check_knob(store, knob)
    with pytest.raises(ValueError, match="gamma=1.5"):
        interference_ratio("decayed", jax.random.key(0), 4, 8, knob=1.5)


@pytest.mark.parametrize("M", [8, 16, 40])
def test_rls_store_is_the_ridge_least_squares_store(M):
    """D5: after M writes RLS holds the ridge store, whatever the order (its rows are written last first)."""
    d, ridge = 16, 1e-3
    X = jax.random.normal(jax.random.key(M), (M, 2 * d))
    K, V = unit(X[:, :d]), unit(X[:, d:])
    want = linear_read(lstsq_write(K, V, ridge=ridge), K, precision=jax.lax.Precision.HIGHEST)
    np.testing.assert_allclose(recall("rls", K, V, K, ridge), want, atol=2e-4)


def test_rls_holds_what_least_squares_holds():
    """The note's exercise: at d_k = 16 and M = 32 least squares reads with ratio sqrt(M/d_k - 1) = 1 (measured
    1.01); the exact-moment form for Gaussian keys gives sqrt((M - d)/(d - 2)) = 1.07."""
    d, M = 16, 32
    rls = interference_ratio("rls", jax.random.key(4), M, d, queries=2048)
    lstsq = interference_ratio("lstsq", jax.random.key(4), M, d, queries=2048)
    assert rls == pytest.approx(lstsq, rel=0.05)
    assert 0.95 < rls < 1.12
    assert capacity_theory("rls", d) == capacity_theory("lstsq", d) and capacity_formula("rls", d) == 2 * d


def test_decayed_theory_pools_its_ages_and_is_hebbian_at_gamma_one():
    d, M, gamma = 16, np.arange(1, 60), 0.9
    np.testing.assert_allclose(decayed_ratio(d, M, 1.0), np.sqrt((M - 1) / d))
    assert decayed_capacity(d, 1.0) == d + 1
    pooled = [np.mean(decayed_age_ratio(d, m, gamma, np.arange(m)) ** 2) for m in M]  # the mean over the ages
    np.testing.assert_allclose(decayed_ratio(d, M, gamma) ** 2, pooled, rtol=1e-9, atol=1e-12)
    assert np.all(decayed_ratio(d, M, gamma) >= decayed_ratio(d, M, 1.0))  # decay never lowers the pooled ratio
    assert 1 < decayed_capacity(d, gamma) < d + 1
    assert decayed_ratio(d, decayed_capacity(d, gamma), gamma) == pytest.approx(1.0)
    # in an endless stream the pair of age H reads with ratio one, and a slow decay keeps nothing readable
    H = decayed_horizon(d, gamma)
    assert decayed_age_ratio(d, 10**6, gamma, H) == pytest.approx(1.0)
    assert decayed_horizon(d, (d / (d + 1)) ** 0.5 + 1e-6) == 0.0 == decayed_horizon(d, 1.0)
    # the default 1 - 1/d keeps the horizon within 6% of its largest, about (d + 1)/e
    best = max(decayed_horizon(64, g) for g in np.linspace(0.9, 0.999, 2000))
    assert decayed_horizon(64, 1 - 1 / 64) > 0.94 * best and best == pytest.approx(65 / math.e, rel=0.05)


def test_decayed_store_measures_its_theory_at_both_ends_and_its_capacity():
    d, gamma, key = 16, 1 - 1 / 16, jax.random.key(5)  # the default gamma is 1 - 1/d
    newest, oldest = end_ratios("decayed", key, 2 * d, d, queries=1024)
    assert newest == pytest.approx(float(decayed_age_ratio(d, 2 * d, gamma, 0)), rel=0.06)
    assert oldest == pytest.approx(float(decayed_age_ratio(d, 2 * d, gamma, 2 * d - 1)), rel=0.06)
    assert interference_ratio("decayed", key, 48, d, queries=1024) == pytest.approx(
        float(theory_ratio("decayed", d, 48)), rel=0.05)
    capacity, _ = find_capacity(lambda M: interference_ratio("decayed", key, M, d, queries=1024), start=d)
    assert capacity == pytest.approx(capacity_theory("decayed", d), rel=0.04)
    assert capacity_theory("decayed", d) < capacity_theory("hebbian", d)


def test_delta_store_reads_its_newest_pair_exactly_and_its_old_ones_worse_than_hebbian():
    """The erasures shrink an old pair's signal without cancelling what interferes with it, so at M = d/2 the
    oldest pair, and the pool, read worse than Hebbian's (whose every pair reads alike)."""
    d, M, key = 16, 8, jax.random.key(6)
    newest, oldest = end_ratios("delta", key, M, d, queries=512)
    hebbian = interference_ratio("hebbian", key, M, d, queries=1024)
    assert newest < 1e-3  # a unit key written with beta = 1 is stored exactly (Chapters 4, 10)
    assert oldest > 1.5 * hebbian
    assert interference_ratio("delta", key, M, d, queries=1024) > 1.05 * hebbian
    assert capacity_theory("delta", d) is None and theory_ratio("delta", d, 8) is None


@pytest.mark.parametrize("beta", [1.0, 0.5])
def test_delta_signal_weight_fades_as_beta_times_one_minus_beta_over_d_per_later_write(beta):
    d, M, stores = 8, 12, 4000
    X = unit(jax.random.normal(jax.random.key(7), (stores, M, d)))
    weights = jax.vmap(lambda K: jnp.diagonal(recall("delta", K, jnp.eye(M), K, beta)))(X)  # [stores, age]
    np.testing.assert_allclose(weights.mean(0), beta * (1 - beta / d) ** np.arange(M), atol=0.02)
