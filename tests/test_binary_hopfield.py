"""The classical Hopfield network on cases with known answers."""

import numpy as np
import pytest
from scipy.linalg import hadamard

from tmem.memory.binary_hopfield import (asymptotic, capacity, capacity_theory, converge, flip_probability,
                                         hebbian_weights, recall_errors, sign_update)


def test_one_pattern_by_hand_is_retrieved_from_a_flipped_bit_and_its_mirror_is_stable():
    xi = np.array([[1.0, -1.0, 1.0]])
    W = hebbian_weights(xi)
    np.testing.assert_allclose(W, np.array([[0, -1, 1], [-1, 0, -1], [1, -1, 0]]) / 3)
    np.testing.assert_array_equal(sign_update(W, np.array([[1.0, 1.0, 1.0]])), xi)  # middle bit flipped back
    np.testing.assert_array_equal(sign_update(W, -xi), -xi)  # the mirror image is a fixed point too
    np.testing.assert_array_equal(sign_update(np.zeros((3, 3)), -xi), -xi)  # a zero field keeps its unit


@pytest.mark.parametrize("M", [1, 8, 31])
def test_orthogonal_patterns_are_all_fixed_points_below_n(M):
    # W xi = (1 - M/N) xi for orthogonal patterns with the diagonal removed, so every one is stable while M < N
    X = hadamard(32).astype(float)[:M]
    e = recall_errors(X)
    assert e["fixed"].all() and (e["wrong_converged"] == 0).all()


def test_convergence_stops_at_a_fixed_point():
    rng = np.random.default_rng(0)
    X = rng.choice([-1.0, 1.0], size=(5, 64))
    W = hebbian_weights(X)
    noisy = X * np.where(rng.random(X.shape) < 0.1, -1.0, 1.0)
    end = converge(W, noisy)
    np.testing.assert_array_equal(sign_update(W, end), end)
    np.testing.assert_array_equal(end, X)  # 5 patterns in 64 units, 10% noise: every one comes back


def test_one_update_flips_bits_at_the_gaussian_rate():
    rng = np.random.default_rng(1)
    N, M = 200, 20
    X = rng.choice([-1.0, 1.0], size=(60, M, N)).astype(np.float32)
    measured = recall_errors(X, max_updates=1)["flipped_one_update"].mean()
    assert measured == pytest.approx(float(flip_probability(N, M)), rel=0.25)  # about 150 flips counted


def test_the_capacities_at_n_100_follow_their_laws():
    rng = np.random.default_rng(2)
    got = {c: capacity(100, c, rng, patterns=2000) for c in ("patterns_fixed", "bits_one_update")}
    assert abs(got["patterns_fixed"] - capacity_theory(100, "patterns_fixed")) <= 1.5  # 8.2: N/(2 ln N) is 10.9
    assert abs(got["bits_one_update"] - capacity_theory(100, "bits_one_update")) <= 1.5  # 19.3
    assert capacity_theory(10_000, "bits_one_update") / 10_000 == pytest.approx(0.185, abs=1e-3)
    assert asymptotic(10_000, "bits_converged") == pytest.approx(1380)
