"""Orbax checkpoints of the train state: exact round trip, steps, metadata, clear errors."""

import jax
import numpy as np
import pytest

from tmem.model import build_model
from tmem.train.checkpoint import CheckpointError, Checkpoints
from tmem.train.optim import build_optimizer, learning_rate
from tmem.train.step import init_state, make_train_step


@pytest.fixture
def trained_state(tiny_cfg):
    cfg, _ = tiny_cfg()
    tx = build_optimizer(cfg.optim, 10)
    graphdef, state = init_state(build_model(cfg, cfg.task), tx, seed=7)
    step = jax.jit(make_train_step(graphdef, cfg.task, tx, 8, learning_rate(cfg.optim, 10)))
    for _ in range(3):
        state, _ = step(state)
    return state


def test_round_trip_restores_every_leaf_exactly(trained_state, tmp_path):
    ckpts = Checkpoints(tmp_path / "ck", config={"model": {"width": 16}})
    ckpts.save(trained_state, {"eval/accuracy": 0.5, "target_step": None})
    restored = Checkpoints(tmp_path / "ck").restore(jax.eval_shape(lambda: trained_state))
    assert int(restored.step) == 3
    leaves = jax.tree.leaves(jax.tree.map(np.asarray, trained_state))
    for a, b in zip(leaves, jax.tree.leaves(jax.tree.map(np.asarray, restored))):
        np.testing.assert_array_equal(a, b)
    assert ckpts.metrics(3) == {"eval/accuracy": 0.5, "target_step": None}
    assert ckpts.config() == {"model": {"width": 16}}


def test_restore_a_chosen_step_and_name_missing_ones(trained_state, tmp_path):
    ckpts = Checkpoints(tmp_path / "ck")
    ckpts.save(trained_state)
    later = trained_state.replace(step=trained_state.step + 5)
    ckpts.save(later)
    assert ckpts.steps() == [3, 8] and ckpts.latest_step() == 8
    assert int(ckpts.restore(jax.eval_shape(lambda: later), step=3).step) == 3
    with pytest.raises(CheckpointError, match=r"no checkpoint at step 4 .* have steps \[3, 8\]"):
        ckpts.restore(jax.eval_shape(lambda: later), step=4)


def test_empty_directory_is_a_clear_error(trained_state, tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint in"):
        Checkpoints(tmp_path / "empty").restore(jax.eval_shape(lambda: trained_state))
