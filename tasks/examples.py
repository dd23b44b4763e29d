"""A fixed training set (`task.train_examples`): N examples made once from the run's seed, cycled over epochs.

MAD varies the size of its training set (12,800 down to 800 examples, 200
epochs) and Zoology trains on a fixed 100,000; tmem's default draws fresh
examples every step. With `task.train_examples=N` the training stream is
epochs of the same N examples, each epoch in its own order, for any task.

Nothing is stored. Example i of the set is the task's own sampler at the key
`fold_in(data_key, i)`, so it is the same example every time it is drawn, and
a batch costs what a fresh one costs. The order of epoch e is a keyed
pseudo-random permutation of [0, N) evaluated only where it is read (a
four-round Feistel network on the next power of four, cycle-walked back into
range): sorting N keys every step would cost more than the step on a CPU.
`data_key` and the order's key come from the run's base key (train.seed), not
from the held-out seed, so the held-out set stays apart.

The stream has a constant batch size, so a batch may straddle two epochs;
MAD's and Zoology's loaders instead end each epoch with a shorter batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


# The cursor's stream positions and the examples' indices are int32 on device (the step counter is): a set of more
# examples, or a run whose positions (train.steps x train.batch_size) go past this, cannot be addressed
MAX_POSITION = 2**31 - 1


@struct.dataclass
class Cursor:
    """Where a batch sits in the stream of a fixed training set: what a fresh batch's key is to `task.sample`."""

    key: jax.Array  # uint32 key data of the run's base key, [..., 2] (a leading axis per microbatch slice)
    start: jax.Array  # int32: the stream position of the batch's first example (step * batch size + offset)


def draw(task, source, n: int):
    """n training examples: `task.sample(source, n)` from a key, or the next n of the fixed set at a Cursor."""
    if isinstance(source, Cursor):
        return fixed_examples(task, source, n)
    return task.sample(source, n)


def rows(batch, start, count: int):
    """Rows [start, start + count) of a batch (`start` may be traced); leaves whose first axis is not the batch's
    (a task's `meta` may have some) are kept whole."""
    n = batch.inputs.shape[0]
    return jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, start, count) if x.ndim and x.shape[0] == n
                        else x, batch)


def draw_rows(task, source, n: int, start, count: int):
    """Rows [start, start + count) of `draw(task, source, n)` (`start` may be traced): the same examples, made
    without the others where the task allows (a fixed set's positions, or a task's `examples` of its own keys),
    else cut from the whole batch.

    Each device of a data mesh draws its share of every microbatch slice this way, so the examples of a step
    depend neither on how many devices train it nor on its microbatch.
    """
    if count == n:
        return draw(task, source, n)
    if isinstance(source, Cursor):
        return fixed_examples(task, Cursor(source.key, source.start + start), count)
    if hasattr(task, "examples"):
        return task.examples(jax.lax.dynamic_slice_in_dim(jax.random.split(source, n), start, count))
    return rows(task.sample(source, n), start, count)


def example_indices(key: jax.Array, size: int, positions: jax.Array) -> jax.Array:
    """Which of the `size` examples sits at each stream position: epoch e is a keyed permutation of [0, size)."""
    order_key = jax.random.split(key)[1]
    epoch, within = positions // size, positions % size
    return jax.vmap(lambda e, p: permuted(jax.random.fold_in(order_key, e), size, p))(epoch, within)


def fixed_examples(task, cursor: Cursor, n: int):
    """The examples at stream positions start .. start + n - 1 of the task's fixed training set."""
    key = jax.random.wrap_key_data(cursor.key)
    data_key = jax.random.split(key)[0]
    index = example_indices(key, task.train_examples, cursor.start + jnp.arange(n, dtype=jnp.int32))
    one = lambda i: jax.tree.map(lambda x: x[0], task.sample(jax.random.fold_in(data_key, i), 1))  # noqa: E731
    return jax.vmap(one)(index)


def permuted(key: jax.Array, size: int, position: jax.Array) -> jax.Array:
    """Element `position` of a keyed pseudo-random permutation of [0, size), without building it.

    A Feistel network is a bijection of [0, 4^h) whatever its round function;
    walking its cycle until the value falls below `size` makes it a bijection
    of [0, size) (at most 4x the range, so a few steps on average).
    """
    half = max(1, ((size - 1).bit_length() + 1) // 2)
    mask = jnp.uint32((1 << half) - 1)
    rounds = jax.random.split(key, 4)

    def feistel(x):
        left, right = x >> half, x & mask
        for r in range(4):
            f = jax.random.bits(jax.random.fold_in(rounds[r], right), dtype=jnp.uint32) & mask
            left, right = right, left ^ f
        return (left << half) | right

    x = feistel(position.astype(jnp.uint32))
    return jax.lax.while_loop(lambda x: x >= size, feistel, x).astype(jnp.int32)
