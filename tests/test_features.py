"""Feature maps: widths, values, and the positivity the normaliser needs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tmem.memory.features import FEATURE_MAPS, feature_map, feature_width


def test_dpfp_multiplies_shifted_rectified_coordinates():
    x = jnp.array([1.0, -2.0])
    r = np.array([1.0, 0.0, 0.0, 2.0])  # relu([x, -x])
    want = np.concatenate([r * np.roll(r, 1), r * np.roll(r, 2)])
    np.testing.assert_allclose(feature_map("dpfp", x, dpfp_nu=2), want)
    assert feature_width("dpfp", 2, dpfp_nu=2) == 8


@pytest.mark.parametrize("name", FEATURE_MAPS)
def test_widths_match_and_positive_maps_are_non_negative(name):
    x = jax.random.normal(jax.random.key(0), (3, 5, 6))
    y = feature_map(name, x, dpfp_nu=3)
    assert y.shape == (3, 5, feature_width(name, 6, dpfp_nu=3))
    if name not in ("identity", "taylor"):  # taylor's features are signed; its kernel is positive (below)
        assert float(y.min()) >= 0.0
    if name == "elu":
        assert float(y.min()) > 0.0  # a strictly positive normaliser
    with pytest.raises(ValueError, match="unknown feature map"):
        feature_map("hedgehog", x)


@pytest.mark.parametrize("d", [1, 5, 16])
def test_the_taylor_map_reads_the_second_order_expansion_of_the_exponential_kernel(d):
    """phi(q).phi(k) = 1 + q.k/sqrt(d) + (q.k)^2/(2d) for every pair, with d_phi = 1 + d + d^2, to float32's
    rounding against the kernel in float64; the kernel is positive where q.k is far below zero too."""
    q, k = jax.random.normal(jax.random.key(1), (2, 7, d)) * 2.0
    k = k.at[0].set(-3.0 * q[0])  # one strongly negative pair
    phi_q, phi_k = feature_map("taylor", q), feature_map("taylor", k)
    assert phi_q.shape == (7, feature_width("taylor", d)) == (7, 1 + d + d * d)
    s = np.asarray(q, np.float64) @ np.asarray(k, np.float64).T / np.sqrt(d)
    np.testing.assert_allclose(np.asarray(phi_q @ phi_k.T), 1 + s + s ** 2 / 2, rtol=1e-5, atol=1e-5)
    assert float((phi_q @ phi_k.T).min()) > 0.0
