"""task.train_examples: a fixed training set, cycled over epochs, for any task."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import compose_config, quick_only
from tasks import TASKS, Cursor, draw, draw_rows
from tasks.examples import MAX_POSITION, example_indices, permuted
from tasks.linreg import LinReg
from tasks.mad_compression import Compression
from tasks.memorize import Memorize
from tasks.mqar import MQAR
from tmem.config import ConfigError, validate


def test_each_epoch_order_is_a_permutation():
    sizes = (1, 17, 1000)

    @jax.jit
    def orders(key):
        return [jax.vmap(lambda p, n=n: permuted(key, n, p))(jnp.arange(n)) for n in sizes]

    a, b = orders(jax.random.key(0)), orders(jax.random.key(1))
    for n, x, y in zip(sizes, a, b):
        np.testing.assert_array_equal(np.sort(x), np.arange(n))
        np.testing.assert_array_equal(np.sort(y), np.arange(n))
    assert not np.array_equal(a[2], b[2]) and not np.array_equal(a[2], np.arange(1000))  # keyed, and shuffled


# a token task's own keys, a MAD task's, a fixed set's positions, and two tasks with neither (every device draws
# the batch and keeps its rows); the quick subset keeps MQAR's keys
TASKS_DRAWN = {"mqar": MQAR(vocab=32, seq_len=16, num_kv_pairs=2), "compression": Compression(vocab=8, seq_len=8),
               "fixed-set": MQAR(vocab=32, seq_len=16, num_kv_pairs=2, train_examples=6),
               "linreg": LinReg(dim=3, num_examples=4), "memorize": Memorize(num_facts=64, num_values=8, seq_len=4)}


@pytest.mark.parametrize("name", quick_only(list(TASKS_DRAWN), {"mqar"}))
def test_rows_of_a_batch_are_drawn_alone(name):
    """The rows a data mesh's devices draw, slice by slice, put back together, are the batch one device draws at
    once: from a fixed set's positions, from a token task's own keys, and cut from the whole batch for a task with
    neither."""
    task, key = TASKS_DRAWN[name], jax.random.key(3)
    source = Cursor(jax.random.key_data(key), jnp.int32(5)) if name == "fixed-set" else key
    drawn = jax.jit(lambda starts: (  # traced starts, as a device's are
        draw(task, source, 12), [draw_rows(task, source, 12, starts[i], 4) for i in range(3)]))
    whole, put_back = drawn(jnp.arange(0, 12, 4))
    for field, leaf in whole.__dict__.items():
        if isinstance(leaf, jax.Array):
            got = np.concatenate([np.asarray(getattr(b, field)) for b in put_back])
            np.testing.assert_array_equal(got, np.asarray(leaf), err_msg=f"{name} {field}")


def test_a_fixed_set_repeats_its_examples_epoch_after_epoch():
    task = MQAR(vocab=32, seq_len=16, num_kv_pairs=2, train_examples=6)
    stream = jax.jit(lambda key, start: draw(task, Cursor(key, start), 12).inputs)
    key = jax.random.key_data(jax.random.key(0))
    rows = [tuple(r) for r in np.asarray(stream(key, 0))]  # stream positions 0..11: two epochs of six examples
    assert len(set(rows[:6])) == 6 and set(rows[6:]) == set(rows[:6])
    assert rows[6:] != rows[:6]  # each epoch in its own order
    # a later cursor continues the same stream (the microbatch slices of a step read it so)
    assert [tuple(r) for r in np.asarray(stream(key, 3))][:9] == rows[3:]
    later = [tuple(r) for r in np.asarray(stream(key, 12))]  # the third and fourth epochs: the same six examples
    assert set(later) == set(rows[:6])
    other_seed = {tuple(r) for r in np.asarray(stream(jax.random.key_data(jax.random.key(1)), 0))}
    assert not other_seed & set(rows)  # another train.seed, another training set


@pytest.mark.slow  # 5 s: two compiles of a step; the quick subset draws the fixed set above
def test_the_train_step_draws_its_batch_from_the_fixed_set(tiny_cfg):
    from tmem.train.build import build
    from tmem.train.step import make_loss, make_train_step

    cfg, _ = tiny_cfg("task.train_examples=8", "train.batch_size=8", "train.microbatch=4")
    built = build(cfg)
    state, loss_fn = built.state, make_loss(built.graphdef, cfg.task)
    # step 0's batch, sliced in two microbatches, is the stream's first eight examples
    loss, _ = jax.jit(lambda s: loss_fn(s.params, s.rest, draw(cfg.task, Cursor(s.key, jnp.int32(0)), 8)))(state)
    step = jax.jit(make_train_step(built.graphdef, cfg.task, built.tx, 8, built.schedule, microbatch=4))
    _, metrics = step(state)
    np.testing.assert_allclose(metrics["loss"], loss, rtol=1e-5)


def test_every_task_has_the_option_and_it_is_validated():
    for name, schema in TASKS.items():
        assert "train_examples" in {f.name for f in dataclasses.fields(schema)}, name
    assert validate(compose_config(["task=repeat", "task.train_examples=5"])).task.train_examples == 5
    assert validate(compose_config([])).task.train_examples is None  # fresh examples stay the default
    with pytest.raises(ConfigError, match="train_examples=0 must be at least 1"):
        validate(compose_config(["task.train_examples=0"]))


def test_the_largest_set_the_int32_cursor_addresses_is_accepted_and_one_more_refused():
    assert validate(compose_config([f"task.train_examples={MAX_POSITION}"])).task.train_examples == MAX_POSITION
    for overrides, field in (([f"task.train_examples={MAX_POSITION + 1}"], "task.train_examples=2147483648 must"),
                             (["task.train_examples=3000000000"], "task.train_examples=3000000000 must be at most"),
                             (["task.train_examples=8", "train.steps=40000000", "train.batch_size=64"],
                              "task.train_examples: train.steps=40000000 x train.batch_size=64"),
                             ([f"train.steps={MAX_POSITION + 1}"], "train.steps=2147483648 must be at most")):
        with pytest.raises(ConfigError, match=field) as error:
            validate(compose_config(overrides))
        assert "\n" not in str(error.value)
    # at the bound the order is still a permutation's element: in range at the last positions the cursor reads
    last = jnp.array([0, MAX_POSITION - 1, MAX_POSITION], jnp.int32)
    index = np.asarray(jax.jit(lambda p: example_indices(jax.random.key(0), MAX_POSITION, p))(last))
    assert ((0 <= index) & (index < MAX_POSITION)).all() and len(set(index[:2])) == 2


def test_tasks_with_their_own_sampler_draw_from_a_fixed_set_too():
    tasks = (Memorize(num_facts=32, num_values=4, seq_len=8, train_examples=5),
             LinReg(dim=3, num_examples=4, train_examples=5))
    key = jax.random.key_data(jax.random.key(0))
    batches = jax.jit(lambda: [draw(t, Cursor(key, jnp.int32(0)), 10) for t in tasks])()
    for task, batch in zip(tasks, batches):
        fresh = jax.eval_shape(lambda t=task: t.sample(jax.random.key(0), 10))
        assert jax.tree.map(jnp.shape, batch) == jax.tree.map(lambda x: x.shape, fresh)
        rows = {tuple(np.asarray(r).ravel()) for r in batch.inputs}
        assert len(rows) == 5  # ten draws, five examples
