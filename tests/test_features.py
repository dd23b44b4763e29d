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
    if name != "identity":
        assert float(y.min()) >= 0.0
    if name == "elu":
        assert float(y.min()) > 0.0  # a strictly positive normaliser
    with pytest.raises(ValueError, match="unknown feature map"):
        feature_map("hedgehog", x)
