"""The memorize task: a fixed map, batches that walk the facts, a held-out pass that is the facts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import compose_config
from tasks import heldout
from tasks.memorize import Memorize
from tmem.config import ConfigError, validate


def test_heldout_scores_every_fact_exactly_once_with_its_fixed_value():
    task = Memorize(num_facts=96, num_values=10, seq_len=16)
    batch = heldout(task)
    assert batch.inputs.shape == (6, 16) and task.vocab_size == 106
    keys = np.asarray(batch.inputs).ravel()
    np.testing.assert_array_equal(np.sort(keys), np.arange(96))
    values = np.asarray(task.values())
    np.testing.assert_array_equal(np.asarray(batch.targets).ravel(), 96 + values[keys])
    assert values.min() >= 0 and values.max() < 10 and len(np.unique(values)) > 1
    # the map is the same in every batch, and new batches permute the facts again
    other = task.sample(jax.random.key(5), 6)
    np.testing.assert_array_equal(np.asarray(other.targets).ravel(), 96 + values[np.asarray(other.inputs).ravel()])
    assert not np.array_equal(np.asarray(other.inputs), np.asarray(batch.inputs))


def test_a_batch_larger_than_the_facts_walks_them_in_whole_passes():
    task = Memorize(num_facts=32, num_values=4, seq_len=8)
    keys = np.asarray(task.sample(jax.random.key(0), 10).inputs).ravel()  # 80 positions: 2.5 passes
    for start in (0, 32):
        np.testing.assert_array_equal(np.sort(keys[start:start + 32]), np.arange(32))


def test_loss_scores_only_the_value_vocabulary():
    task = Memorize(num_facts=16, num_values=4, seq_len=8)
    batch = heldout(task)
    logits = jax.nn.one_hot(batch.targets, task.vocab_size) * 5.0
    logits = logits.at[..., :16].set(100.0)  # key tokens would win an argmax over the whole vocabulary
    _, metrics = task.loss(logits, batch)
    assert float(metrics["accuracy"]) == 1.0


def test_memorize_experiment_validates_and_bad_shapes_give_one_line():
    cfg = validate(compose_config(["experiment=memorize"]))
    assert (cfg.task.name, cfg.mixer.name, cfg.model.depth, cfg.model.train_embeddings) == ("memorize", "none", 1,
                                                                                              False)
    assert cfg.train.batch_size * cfg.task.seq_len == cfg.task.num_facts and cfg.train.target == 1.0
    with pytest.raises(ConfigError, match="multiple of task.seq_len"):
        validate(compose_config(["task=memorize", "task.num_facts=100"]))


def test_fixed_embeddings_are_not_trained_and_not_counted():
    from flax import nnx

    from tmem.model import build_model, count_params
    from tmem.train.optim import build_optimizer
    from tmem.train.step import init_state, make_train_step

    cfg = validate(compose_config(["experiment=memorize", "task.num_facts=64", "task.num_values=8",
                                   "task.seq_len=16", "train.batch_size=4", "mlp.expansion=1", "logger=disabled"]))
    model = build_model(cfg, cfg.task)
    width, hidden = cfg.model.width, cfg.model.width
    assert count_params(model) == 2 * width * hidden + 3 * 2 * width  # MLP + three layer norms, no embedding
    tx = build_optimizer(cfg.optim, 10)
    graphdef, state = init_state(model, tx, 0)
    embedding = np.asarray(model.embed.embedding[...])
    step = jax.jit(make_train_step(graphdef, cfg.task, tx, 4, lambda s: 0.0))
    new, metrics = step(state)
    new, metrics = step(new)
    assert np.isfinite(float(metrics["loss"]))
    trained = nnx.merge(graphdef, new.params, new.rest)
    np.testing.assert_array_equal(np.asarray(trained.embed.embedding[...]), embedding)
    assert not np.allclose(np.asarray(trained.blocks[0].mlp.w_in.kernel[...]),
                           np.asarray(model.blocks[0].mlp.w_in.kernel[...]))
    # no mixer: a position's logits depend on its own token only
    tokens = jnp.arange(16)[None]
    changed = tokens.at[0, 5].set(40)
    a, b = trained(tokens), trained(changed)
    np.testing.assert_allclose(np.delete(np.asarray(a), 5, axis=1), np.delete(np.asarray(b), 5, axis=1), atol=1e-6)
