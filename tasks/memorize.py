"""Memorize a fixed random map from keys to values: facts only the weights can hold.

MAD's memorisation task (athms/mad-lab) is the anchor: one global key -> value
map, fixed for the whole run, that no context reveals. Here every input token
is a key and its target is the key's value at the same position, so there is
nothing in the sequence to copy and a model without a mixer sees one key at a
time (MAD interleaves keys and values, which a model with a mixer could read).

Keys are tokens [0, num_facts) and values tokens [num_facts, num_facts +
num_values); value i of the map is drawn uniformly from the value vocabulary
with `map_seed`, so each fact carries log2(num_values) bits. A batch walks
through random permutations of the keys, so a batch of num_facts positions is
one pass over every fact. The held-out set is the facts themselves: one pass
of num_facts / seq_len sequences, each fact scored once. Scores are over the
value vocabulary only (argmax among the values).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from tasks.base import Batch, Options, token_loss


@dataclasses.dataclass(frozen=True)
class Memorize(Options):
    num_facts: int = 1024
    num_values: int = 256
    seq_len: int = 32  # facts per sequence; a model without a mixer reads each on its own
    map_seed: int = 0
    heldout_seed: int = 2**31 - 1

    name = "memorize"
    input_kind = "tokens"
    layout = "causal"
    target_metric = "accuracy"  # the fraction of facts stored (argmax correct)
    default_target = 1.0  # every fact stored
    higher_is_better = True

    def __post_init__(self):
        checks = [
            (self.num_facts > 0 and self.num_values > 1, "task.num_facts must be positive and task.num_values > 1"),
            (self.num_facts % self.seq_len == 0,
             "task.num_facts must be a multiple of task.seq_len (the held-out pass scores each fact once)"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def vocab_size(self) -> int:
        return self.num_facts + self.num_values

    @property
    def heldout_size(self) -> int:
        """Sequences in one pass over the facts."""
        return self.num_facts // self.seq_len

    def values(self) -> jax.Array:
        """The map: value index (0 .. num_values - 1) of every key."""
        return jax.random.randint(jax.random.key(self.map_seed), (self.num_facts,), 0, self.num_values)

    def sample(self, key: jax.Array, batch_size: int) -> Batch:
        F, T = self.num_facts, self.seq_len
        n = batch_size * T
        passes = jax.random.split(key, -(-n // F))
        keys = jnp.concatenate([jax.random.permutation(k, F) for k in passes])[:n].astype(jnp.int32)
        keys = keys.reshape(batch_size, T)
        return Batch(inputs=keys, targets=(F + self.values()[keys]).astype(jnp.int32),
                     mask=jnp.ones((batch_size, T), jnp.float32), meta={"fact": keys})

    def loss(self, logits, batch):
        """Cross-entropy and accuracy over the value tokens only."""
        F = self.num_facts
        return token_loss(logits[..., F:], batch.replace(targets=batch.targets - F))
