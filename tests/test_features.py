"""Feature maps: widths, values, and the positivity the normaliser needs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tmem.memory.features import FEATURE_MAPS, feature_map, feature_width, random_features


def test_dpfp_multiplies_shifted_rectified_coordinates():
    x = jnp.array([1.0, -2.0])
    r = np.array([1.0, 0.0, 0.0, 2.0])  # relu([x, -x])
    want = np.concatenate([r * np.roll(r, 1), r * np.roll(r, 2)])
    np.testing.assert_allclose(feature_map("dpfp", x, dpfp_nu=2), want)
    assert feature_width("dpfp", 2, dpfp_nu=2) == 8


@pytest.mark.parametrize("name", FEATURE_MAPS)
def test_widths_match_and_positive_maps_are_non_negative(name):
    x = jax.random.normal(jax.random.key(0), (3, 5, 6))
    projection = random_features(jax.random.key(1), 6, 12) if name == "performer" else None
    y = feature_map(name, x, dpfp_nu=3, projection=projection)
    assert y.shape == (3, 5, feature_width(name, 6, dpfp_nu=3, num_features=12))
    if name not in ("identity", "taylor"):  # taylor's features are signed; its kernel is positive (below)
        assert float(y.min()) >= 0.0
    if name in ("elu", "performer"):
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


def _performer_estimates(q, k, v, m: int, seeds: int, orthogonal: bool = False):
    """Per seed (a fresh projection each): phi(q).phi(k) for every pair [S, Q, K], and the normalised linear read
    of v against the softmax read over the same pairs [S, Q, d_v]."""
    from tmem.memory.features import performer

    def one(key):
        w = random_features(key, q.shape[-1], m, orthogonal)
        kernel = performer(q, w) @ performer(k, w).T
        return kernel, (kernel @ v) / kernel.sum(-1, keepdims=True)

    return jax.vmap(one)(jax.random.split(jax.random.key(m), seeds))


def _pairs(d=16, n=32):
    q, k, v = jax.random.normal(jax.random.key(5), (3, n, d)) * jnp.array([0.3, 0.3, 1.0])[:, None, None]
    exact = jnp.exp(q @ k.T / np.sqrt(d))
    return q, k, v, exact, jax.nn.softmax(q @ k.T / np.sqrt(d), -1) @ v


@pytest.mark.parametrize("orthogonal", [False, True])
def test_performer_features_estimate_the_softmax_kernel_without_bias(orthogonal):
    """The mean of phi(q).phi(k) over 4,000 projections of m = 16 misses exp(q.k/sqrt(d)) by its standard error:
    over 1,024 pairs the standardised misses have an RMS near 1 (1.14 independent, 0.94 orthogonal) and none
    reaches 6 (3.9 at most). A biased map misses by more: orthogonal blocks from QR without R's signs, 3.9 RMS."""
    q, k, v, exact, _ = _pairs()
    kernel, _ = _performer_estimates(q, k, v, 16, 4000, orthogonal)
    z = (kernel.mean(0) - exact) / (kernel.std(0) / np.sqrt(kernel.shape[0]))
    assert float(jnp.sqrt(jnp.mean(z ** 2))) < 1.3 and float(jnp.abs(z).max()) < 6.0


def test_the_performer_error_falls_as_one_over_root_m():
    """The RMS relative error of the kernel, and of the normalised read against softmax attention's, over
    m = 16..1024 (independent features, 8 projections each): a log-log slope of -1/2 within 0.1 (-0.49 and -0.45
    measured), as the estimator's variance, 1/m of one feature's, says; the normalised read's to first order in the
    error, so the pairs' scores are kept small (q and k of norm about 1.2), where that order holds from m = 16."""
    q, k, v, exact, softmax = _pairs()
    ms = [16, 32, 64, 128, 256, 512, 1024]
    kernel_rms, read_rms = [], []
    for m in ms:
        kernel, read = _performer_estimates(q, k, v, m, 8)
        kernel_rms.append(float(jnp.sqrt(jnp.mean((kernel / exact[None] - 1) ** 2))))
        read_rms.append(float(jnp.sqrt(jnp.mean((read - softmax[None]) ** 2))))
    for rms in (kernel_rms, read_rms):
        slope = np.polyfit(np.log(ms), np.log(rms), 1)[0]
        assert abs(slope + 0.5) < 0.1, (slope, rms)


def test_a_stabilised_query_changes_only_a_factor_the_normalised_read_divides_out():
    from tmem.memory.features import performer

    q, k, v, _, _ = _pairs()
    q = q * 6.0  # exponents near 40: the plain features of such queries are 1e17 and more
    w = random_features(jax.random.key(0), 16, 64)
    reads = [(lambda a: (a @ v) / a.sum(-1, keepdims=True))(performer(q, w, stabilise=s) @ performer(k, w).T)
             for s in (False, True)]
    np.testing.assert_allclose(reads[1], reads[0], rtol=1e-4, atol=1e-5)
    assert float(performer(q, w, stabilise=True).max()) == pytest.approx(64 ** -0.5)
