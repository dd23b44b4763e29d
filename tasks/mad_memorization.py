"""MAD's memorization: a fixed key -> value map, learned in the weights from a small fixed training set.

One example with seq_len T = 8 (k a key, I the insert token)::

    position  0  1  2  3  4  5  6  7
    input     k1 I  k2 I  k3 I  k1 I
    target       v1    v2    v3    v1     at the insert tokens only

Token V-1 is the insert token; keys are [0, (V-1)/2) and values
[(V-1)/2, V-1). The map, drawn from `map_seed`, sends each key to a different
value (MAD zips shuffled keys with shuffled values). Keys are uniform with
repeats. Nothing in a sequence tells a key's value: only the weights can
hold it, and only for keys the training set shows. MAD trains on 256
examples (`train_examples`, 200 epochs) and tests on 1,280 fresh ones from
the same map, so at large vocabularies part of the test asks for facts never
seen. The batch scores only the insert positions (`positions`).

tasks/memorize.py is tmem's own variant, where every position is a key and
its target (a model without a mixer can learn it) and the held-out set is the
facts themselves, each once. This task keeps MAD's layout, sampling and test.

Where tmem differs from MAD: the map and the examples come from JAX's
generator, so they are not MAD's numpy draws (the same distributions).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from tasks.base import Batch, check
from tasks.mad import MadTask


@dataclasses.dataclass(frozen=True)
class Memorization(MadTask):
    vocab: int = 256
    seq_len: int = 32
    map_seed: int = 12345  # MAD's seed
    heldout_size: int = 1280
    heldout_seed: int = 2**31 - 1
    train_examples: int | None = dataclasses.field(default=256, kw_only=True)  # MAD's training set

    name = "mad_memorization"

    def __post_init__(self):
        check(
            (self.vocab >= 3, "task.vocab must be at least 3 (a key, a value and the insert token)"),
            (self.seq_len % 2 == 0 and self.seq_len >= 2, "task.seq_len must be even (key, insert token pairs)"),
            (self.heldout_size >= 1, "task.heldout_size must be at least 1"),
        )

    @property
    def num_keys(self) -> int:
        return (self.vocab - 1) // 2

    def values(self) -> jax.Array:
        """The map: every key's value token, distinct across keys."""
        K = self.num_keys
        return K + jax.random.permutation(jax.random.key(self.map_seed), self.vocab - 1 - K)[:K]

    def _example(self, key: jax.Array, test: bool = False) -> Batch:
        P = self.seq_len // 2
        keys = jax.random.randint(key, (P,), 0, self.num_keys)
        inputs = jnp.stack([keys, jnp.full(P, self.vocab - 1)], -1).reshape(-1).astype(jnp.int32)
        return Batch(inputs=inputs, targets=self.values()[keys].astype(jnp.int32), mask=jnp.ones(P, jnp.float32),
                     positions=2 * jnp.arange(P, dtype=jnp.int32) + 1)
