"""The learning-rate schedule: warmup, then the chosen decay."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tmem.schema import OptimConfig
from tmem.train.build import build
from tmem.train.optim import learning_rate


@pytest.mark.parametrize("schedule, end", [("cosine", 0.1), ("linear", 0.1), ("constant", 1.0)])
def test_warmup_then_decay(schedule, end):
    cfg = OptimConfig(lr=2e-3, warmup_steps=10, schedule=schedule, final_lr_ratio=0.1)
    lr = learning_rate(cfg, decay_end=110)
    assert float(lr(0)) == 0.0
    np.testing.assert_allclose(float(lr(5)), 1e-3, rtol=1e-6)
    np.testing.assert_allclose(float(lr(10)), 2e-3, rtol=1e-6)
    np.testing.assert_allclose(float(lr(110)), 2e-3 * end, rtol=1e-5)
    assert all(float(lr(s)) >= float(lr(s + 1)) - 1e-12 for s in range(10, 110))


@pytest.mark.parametrize("decay_steps, end", [(None, 200), (50, 50)])
def test_the_decay_ends_at_decay_steps_else_at_the_runs_last_step(tiny_cfg, decay_steps, end):
    cfg, _ = tiny_cfg("train.steps=200", "optim.warmup_steps=10", f"optim.decay_steps={decay_steps or 'null'}")
    built, final = build(cfg), 0.1 * cfg.optim.lr
    np.testing.assert_allclose([float(built.schedule(s)) for s in (end, end + 30)], final, rtol=1e-5)
    assert float(built.schedule(end - 20)) > 1.2 * final
    # the optimizer applies that schedule: with a constant gradient, Adam's normalised step is 1, so each
    # update is minus the step's rate (a vector, so no weight decay; under the clipping norm)
    params, grads = {"w": jnp.zeros(3)}, {"w": jnp.full(3, 0.1)}
    opt_state, update = built.tx.init(params), jax.jit(built.tx.update)  # compiled once, not dispatched op by op
    for step in range(end + 5):
        updates, opt_state = update(grads, opt_state, params)
        np.testing.assert_allclose(-float(updates["w"][0]), float(built.schedule(step)), rtol=1e-5, atol=1e-12)


def test_a_rows_recommended_weight_decay_reaches_the_optimizer_on_matrices_only(tiny_cfg):
    """Mamba-2 recommends AdamW's weight decay 0.3 (mixer.recipe): with a zero gradient Adam's step is 0, so a
    matrix's update is minus rate x 0.3 x the matrix, and a vector (a norm's scale, a bias, A_log) does not decay."""
    cfg, _ = tiny_cfg("mixer=mamba2", "optim.warmup_steps=0")
    built = build(cfg)
    params = {"matrix": jnp.ones((2, 3)), "vector": jnp.ones(3)}
    zeros = {k: jnp.zeros_like(v) for k, v in params.items()}
    updates, _ = built.tx.update(zeros, built.tx.init(params), params)
    rate = float(built.schedule(0))
    assert cfg.optim.weight_decay == 0.3
    np.testing.assert_allclose(updates["matrix"], -rate * 0.3 * params["matrix"], rtol=1e-6)
    np.testing.assert_array_equal(updates["vector"], 0.0)
