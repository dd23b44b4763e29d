"""The in-context regression task: prompt formats, teacher, input range, loss."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tasks import heldout
from tasks.linreg import LinReg


def sample(task, n=64, seed=0):
    return task.sample(jax.random.key(seed), n)


def test_von_oswald_prompt_holds_the_pairs_and_a_zero_query_slot():
    task = LinReg(dim=4, num_examples=6)
    b = sample(task)
    x, y = b.meta["x"], b.meta["y"]
    assert b.inputs.shape == (64, 7, 5) and task.seq_len == 7 and task.token_dim == 5
    np.testing.assert_array_equal(b.inputs[:, :, :4], x)
    np.testing.assert_array_equal(b.inputs[:, :6, 4], y[:, :6])
    assert float(jnp.abs(b.inputs[:, 6, 4]).max()) == 0.0  # the query's label never enters
    np.testing.assert_array_equal(b.positions, jnp.full((64, 1), 6))
    np.testing.assert_array_equal(b.targets[:, 0], y[:, 6])


@pytest.mark.parametrize("score", ["query", "every"])
def test_garg_prompt_interleaves_x_and_y_tokens(score):
    task = LinReg(dim=3, num_examples=5, format="garg", score=score)
    b = sample(task)
    x, y = b.meta["x"], b.meta["y"]
    assert b.inputs.shape == (64, 11, 4) and task.seq_len == 11 and task.layout == "causal"
    np.testing.assert_array_equal(b.inputs[:, 0::2, :3], x)  # x tokens [x_i, 0]
    assert float(jnp.abs(b.inputs[:, 0::2, 3]).max()) == 0.0
    np.testing.assert_array_equal(b.inputs[:, 1::2, 3], y[:, :5])  # y tokens [0, y_i]
    assert float(jnp.abs(b.inputs[:, 1::2, :3]).max()) == 0.0
    if score == "every":
        np.testing.assert_array_equal(b.positions[0], 2 * jnp.arange(6))
        np.testing.assert_array_equal(b.targets, y)
    else:
        np.testing.assert_array_equal(b.positions, jnp.full((64, 1), 10))
        np.testing.assert_array_equal(b.targets[:, 0], y[:, 5])


def test_labels_come_from_the_teacher_plus_noise():
    clean = sample(LinReg(dim=5, num_examples=8), n=2000)
    np.testing.assert_allclose(clean.meta["y"], jnp.einsum("bnd,bd->bn", clean.meta["x"], clean.meta["w"]),
                               rtol=1e-5, atol=1e-6)
    noisy = sample(LinReg(dim=5, num_examples=8, noise_std=0.3), n=2000)
    residual = noisy.meta["y"] - jnp.einsum("bnd,bd->bn", noisy.meta["x"], noisy.meta["w"])
    assert abs(float(residual.std()) - 0.3) < 0.01


def test_input_range_scales_the_same_draws():
    task = LinReg(dim=4, num_examples=6)
    x = sample(task).meta["x"]
    assert float(jnp.abs(x).max()) <= 0.5 and float(jnp.abs(x).max()) > 0.45  # U(-1/2, 1/2) as von Oswald's code
    x3 = sample(dataclasses.replace(task, input_range=3.0)).meta["x"]
    np.testing.assert_allclose(x3, 3 * x, rtol=1e-6)
    normal = sample(LinReg(dim=4, num_examples=6, input_dist="normal"), n=4000).meta["x"]
    assert abs(float(normal.std()) - 1.0) < 0.03


def test_loss_is_half_the_mean_squared_error_over_scored_positions():
    task = LinReg(dim=3, num_examples=4, format="garg", score="every")
    b = sample(task, n=8)
    pred = b.targets + 2.0
    loss, metrics = task.loss(pred, b)
    assert float(loss) == pytest.approx(2.0) and float(metrics["loss"]) == pytest.approx(2.0)
    loss, _ = task.loss(pred.at[:, 0].add(10.0), b.replace(mask=b.mask.at[:, 0].set(0.0)))
    assert float(loss) == pytest.approx(2.0)  # unscored positions do not count


def test_zero_predictor_scores_half_the_label_variance():
    # E[y^2] = d E[x^2] = d / 12 for x ~ U(-1/2, 1/2): 0.417 at d = 10, as von Oswald's numbers assume
    task = LinReg(heldout_size=20000)
    b = heldout(task)
    loss, _ = task.loss(jnp.zeros_like(b.targets), b)
    assert float(loss) == pytest.approx(10 / 24, rel=0.03)


def test_heldout_set_is_fixed():
    task = LinReg(dim=3, num_examples=4, heldout_size=16)
    np.testing.assert_array_equal(heldout(task).inputs, heldout(task).inputs)
    assert not np.allclose(heldout(task).inputs, sample(task, n=16).inputs)


@pytest.mark.parametrize("fields, message", [
    ({"score": "every"}, "task.score=every needs task.format=garg"),
    ({"format": "gpt"}, "task.format must be vonoswald or garg"),
    ({"input_dist": "laplace"}, "task.input_dist"),
    ({"noise_std": -1.0}, "task.noise_std"),
])
def test_bad_fields_are_rejected_in_one_line(fields, message):
    with pytest.raises(ValueError, match=message):
        LinReg(**fields)
