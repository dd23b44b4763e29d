"""The rephrasing probe's measurement on a memory whose response region is known exactly."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tmem.probes.rephrasing import crossing, moved_codes, nearest_code, recall_under_noise, widths

RADII = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0]


def test_codes_move_by_exactly_r_times_their_norm():
    codes = jax.random.normal(jax.random.key(0), (5, 8)) * jnp.arange(1, 6)[:, None]
    x = moved_codes(codes, RADII, 3, jax.random.key(1))
    moved = np.linalg.norm(np.asarray(x - codes[None, :, None]), axis=-1)  # [R, N, draws]
    expected = np.asarray(RADII)[:, None, None] * np.linalg.norm(np.asarray(codes), axis=-1)[None, :, None]
    np.testing.assert_allclose(moved, np.broadcast_to(expected, moved.shape), rtol=1e-5, atol=1e-5)


def test_a_memory_that_answers_within_a_ball_has_that_balls_width():
    # orthogonal codes of different norms, each fact answered while the query is within 0.55 |e| of its code
    # (nearer than half the sqrt(2) |e| between codes, so no other fact's ball is reached first)
    N, d, theta = 6, 8, 0.55
    codes = jnp.eye(N, d) * jnp.arange(2.0, 2.0 + N)[:, None]
    values = np.arange(N) + 10

    @jax.jit
    def predict(x):
        dist = jnp.linalg.norm(x[:, None] - codes[None], axis=-1) / jnp.linalg.norm(codes, axis=-1)[None]
        nearest = jnp.argmin(dist, -1)
        return jnp.where(jnp.min(dist, -1) < theta, jnp.asarray(values)[nearest], -1)

    per_fact = recall_under_noise(predict, codes, values, RADII, 8, jax.random.key(2))
    np.testing.assert_array_equal(per_fact, np.where(np.asarray(RADII) < theta, 1.0, 0.0)[:, None] * np.ones(N))
    np.testing.assert_array_equal(widths(per_fact, RADII), 0.5)
    assert crossing(per_fact.mean(1), RADII) == pytest.approx(0.55)  # 1 at 0.5, 0 at 0.6: one half between


def test_widths_and_crossing_read_a_falling_curve():
    per_fact = np.array([[1.0, 1.0, 1.0], [0.75, 0.4, 1.0], [0.5, 0.0, 0.25], [0.0, 0.0, 0.75]])  # 4 radii, 3 facts
    radii = [0.0, 1.0, 2.0, 3.0]
    np.testing.assert_array_equal(widths(per_fact, radii), [2.0, 0.0, 1.0])  # fact 2 fails at 2, held again at 3
    assert crossing(np.array([1.0, 0.8, 0.4, 0.0]), radii) == pytest.approx(1.75)
    assert crossing(np.array([1.0, 0.9, 0.8, 0.7]), radii) is None


def test_the_nearest_code_reference_owns_each_facts_voronoi_cell():
    # two codes e and -e on a line: a move of r |e| leaves e's cell only toward -e and only past r = 1
    codes = jnp.array([[2.0], [-2.0]])
    per_fact = recall_under_noise(nearest_code(codes, [7, 9]), codes, [7, 9], [0.0, 0.5, 0.99, 1.01, 3.0], 64,
                                  jax.random.key(3))
    np.testing.assert_array_equal(per_fact[:3], 1.0)
    assert np.all((per_fact[3:] > 0.25) & (per_fact[3:] < 0.75))  # about half the draws point the other way
    np.testing.assert_array_equal(per_fact[3], per_fact[4])  # and every one of those crosses
