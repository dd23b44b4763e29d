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


@pytest.fixture
def two_steps(trained_state, tmp_path):
    """A folder with steps 3 and 8, and the abstract state that restores them."""
    ckpts = Checkpoints(tmp_path / "ck", config={"model": {"width": 16}}, keep=None)
    ckpts.save(trained_state, {"eval/accuracy": 0.5})
    later = trained_state.replace(step=trained_state.step + 5)
    ckpts.save(later, {"eval/accuracy": 0.7})
    ckpts.close()
    return tmp_path / "ck", jax.eval_shape(lambda: later)


def test_a_damaged_metrics_file_is_named_and_leaves_the_other_steps_readable(two_steps):
    folder, abstract = two_steps
    (folder / "8" / "metrics" / "metrics").write_text("")
    ckpts = Checkpoints(folder)
    assert ckpts.steps() == [3, 8] and ckpts.config() == {"model": {"width": 16}}
    assert int(ckpts.restore(abstract, step=3).step) == 3 and ckpts.metrics(3) == {"eval/accuracy": 0.5}
    with pytest.raises(CheckpointError, match=r"8/metrics/metrics \(the held-out metrics of step 8\) cannot be read"):
        ckpts.metrics(8)
    with pytest.raises(CheckpointError, match=r"8/metrics/metrics"):  # orbax's saver reads every step's metrics
        ckpts.save(abstract.replace(step=9))


@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_damaged_state_files_are_reported_as_damage_with_the_intact_steps(two_steps, damage):
    folder, abstract = two_steps
    data = max((p for p in (folder / "8" / "state").rglob("*") if p.is_file() and "/d/" in str(p)),
               key=lambda p: p.stat().st_size)
    data.write_bytes(b"") if damage == "truncate" else data.unlink()
    ckpts = Checkpoints(folder)
    with pytest.raises(CheckpointError, match=r"step 8 .* is damaged: .* the other steps \(\[3\]\)"):
        ckpts.restore(abstract, step=8)
    assert int(ckpts.restore(abstract, step=3).step) == 3


def test_a_state_of_another_shape_is_reported_as_a_config_change(two_steps):
    folder, abstract = two_steps
    grown = abstract.replace(step=jax.ShapeDtypeStruct((2,), abstract.step.dtype))
    with pytest.raises(CheckpointError, match="does not fit this config"):
        Checkpoints(folder).restore(grown, step=8)


def test_a_step_saved_without_metrics_reads_as_none_and_saving_continues(trained_state, tmp_path):
    Checkpoints(tmp_path / "ck").save(trained_state)
    ckpts = Checkpoints(tmp_path / "ck")  # a new session: the saver is made over the existing step
    assert ckpts.metrics(3) == {}
    ckpts.save(trained_state.replace(step=trained_state.step + 1), {"eval/accuracy": 0.5})
    assert ckpts.steps() == [3, 4] and ckpts.metrics(4) == {"eval/accuracy": 0.5}
