"""Key overwrite: MQAR in which some keys are written again, with a new value, before they are queried.

The note (Chapters 8-10) predicts that the delta rule wins here: its write
first subtracts what the memory already returns for the key, so a second
write replaces the old value, while a purely additive memory (linear
attention) stores the sum and reads back a blend of the old and new values.
The right answer is always the latest value.

Layout of one example with 4 keys, 2 of them (K2 and K3) written again with
new values W2 and W3, and T = 24 (. a filler token drawn from the whole
vocabulary)::

    position  0  1  2  3  4  5  6  7  8  9  10 11 | 12 13 14 15 16 17 18 19 20 21 22 23
    input     K1 V1 K2 V2 K3 V3 K2 W2 K4 V4 K3 W3 | K3 .  K2 .  .  .  K1 .  K4 .  .  .
    target                                        | W3    W2          V1    V4
              kv + o writes, in random order         query region: MQAR's, after 2 (kv + o)

Keys come from [1, V/2) and values from [V/2, V) as in MQAR; the kv first
values and the o new ones are all distinct, so an answer names the write it
came from. The overwritten keys are a random subset, and the kv + o writes
come in random order (a key's first write always before its second), so no
position marks a new value: with the rewrites in a fixed block after the
first writes, a model could find the answer by its place instead of its time
(the last write). The query region is MQAR's (power-law gaps after the writes, every key queried
once, in random order).

`meta`: `distance` from each query back to the latest write of its key (the
one that holds the answer), `overwritten` whether its key was written twice,
and `old_value` its first value (equal to the target when it was written
once), so a probe can tell a stale answer from any other error. The loss adds
accuracy on the overwritten and the kept queries and `stale_rate`, the
fraction of overwritten queries answered with the old value. With
`num_overwrites=0` the task is MQAR with this task's random stream (a control).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from tasks.base import Batch, TokenTask, check, token_loss
from tasks.mqar import distinct, query_positions, recall_sequence


@dataclasses.dataclass(frozen=True)
class Overwrite(TokenTask):
    vocab: int = 256
    seq_len: int = 64
    num_kv_pairs: int = 4
    num_overwrites: int = 2  # how many of the keys are written a second time, with a new value
    power_a: float = 0.01
    random_non_queries: bool = True
    heldout_size: int = 3000
    heldout_seed: int = 2**31 - 1

    name = "overwrite"
    target_metric = "accuracy"  # over every query; accuracy_overwritten is the prediction's measure
    higher_is_better = True

    def __post_init__(self):
        kv, o = self.num_kv_pairs, self.num_overwrites
        check(
            (kv >= 1, "task.num_kv_pairs must be at least 1"),
            (0 <= o <= kv, "task.num_overwrites must be in [0, task.num_kv_pairs]"),
            (self.heldout_size >= 1, "task.heldout_size must be at least 1"),
            (self.seq_len % 2 == 0, "task.seq_len must be even"),
            (self.vocab > self.seq_len, "task.vocab must exceed task.seq_len"),
            # with vocab > seq_len this also leaves room for kv distinct keys and kv + o distinct values
            (2 * kv + 2 * o + 2 * kv <= self.seq_len,
             "task.seq_len too short: need 2*kv (first writes) + 2*num_overwrites + 2*kv (queries) <= seq_len"),
            (0 < self.power_a <= 1, "task.power_a must be in (0, 1]"),
        )

    def _example(self, key: jax.Array) -> Batch:
        kv, o, T, V = self.num_kv_pairs, self.num_overwrites, self.seq_len, self.vocab
        k_keys, k_values, k_which, k_order, k_gaps, k_fill = jax.random.split(key, 6)
        keys = distinct(k_keys, 1, V // 2, kv)
        values = distinct(k_values, V // 2, V, kv + o)  # kv first values, then o new ones
        first = values[:kv]
        which = distinct(k_which, 0, kv, o)  # the overwritten keys
        latest = first.at[which].set(values[kv:])

        # The kv + o writes in random order; of a key's two writes the earlier carries its first value.
        written = jnp.concatenate([jnp.arange(kv), which])[jax.random.permutation(k_order, kv + o)]
        slot = jnp.arange(kv + o)
        again = ((written[:, None] == written[None, :]) & (slot[None, :] < slot[:, None])).any(1)
        value = jnp.where(again, latest[written], first[written])
        context = jnp.stack([keys[written], value], -1).reshape(-1)
        C = context.shape[0]

        query_pos = query_positions(k_gaps, C, T, kv, self.power_a)
        inputs = recall_sequence(k_fill, context, query_pos, keys, T, V, self.random_non_queries)
        latest_pos = jnp.zeros(kv, jnp.int32).at[written].max(2 * slot)
        return Batch(
            inputs=inputs,
            targets=latest.astype(jnp.int32),
            mask=jnp.ones(kv, jnp.float32),
            positions=query_pos,
            meta={"distance": query_pos - latest_pos,
                  "overwritten": jnp.zeros(kv, bool).at[which].set(True),
                  "old_value": first.astype(jnp.int32)},
        )

    def loss(self, logits, batch):
        """token_loss's loss and accuracy, plus the overwritten and kept queries apart and the stale answers.

        Every group is weighted by the batch mask, so the held-out evaluation's
        padded rows count for nothing. A group the config cannot have (no
        overwrites, or every key overwritten) reports no metric rather than a 0.
        """
        loss, metrics = token_loss(logits, batch)
        answer = jnp.argmax(logits, -1)
        overwritten = batch.meta["overwritten"].astype(jnp.float32) * batch.mask
        kept = (1.0 - batch.meta["overwritten"].astype(jnp.float32)) * batch.mask

        def rate(hit, weight):
            return (hit.astype(jnp.float32) * weight).sum() / jnp.maximum(weight.sum(), 1.0)

        if self.num_overwrites > 0:
            metrics["accuracy_overwritten"] = rate(answer == batch.targets, overwritten)
            metrics["stale_rate"] = rate(answer == batch.meta["old_value"], overwritten)
        if self.num_overwrites < self.num_kv_pairs:
            metrics["accuracy_kept"] = rate(answer == batch.targets, kept)
        return loss, metrics
