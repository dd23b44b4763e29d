"""Multi-query associative recall (MQAR), as Zoology generates it.

Layout of one example with 4 key-value pairs and T = 20 (K key, V value,
q a queried key, . a filler token drawn from the whole vocabulary)::

    position  0  1  2  3  4  5  6  7 | 8  9 10 11 12 13 14 15 16 17 18 19
    input     K1 V1 K2 V2 K3 V3 K4 V4 | K3 .  K1 .  .  .  K4 .  K2 .  .  .
    target                            | V3    V1          V4    V2
              context block (2 kv)    | query region: key j sits at 2*gap_j

Keys come from [1, V/2) and values from [V/2, V), each distinct within an
example. The query region has (T - 2 kv) / 2 even slots; the kv gaps are
drawn without replacement with p_i proportional to i^(a-1), i = 1..slots, so
queries cluster just after the context block with a heavy tail. Every key is
queried once, in random order, and the model must predict its value at the
query position itself. Loss and accuracy count only those kv positions.
With `num_passes` > 1 the context block is repeated (JRT style).

With `distractor_pairs` = m > 0 a second document of m pairs, never queried,
sits before or after the queried one (`distractor_place`); its keys and values
are disjoint from the queried pairs', so a model that fails on it was diluted
(its read spread over more pairs, or its state filled), not misled by an
overwritten key (the note's Chapter 13, "Adding a document dilutes another").

Sampling is pure JAX (Gumbel top-k draws without replacement), so the train
step samples every batch on device.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from tasks.base import Batch, TokenTask, check, token_loss


def distinct(key: jax.Array, low: int, high: int, k: int) -> jax.Array:
    """k distinct integers from [low, high), uniformly (Gumbel top-k)."""
    return low + jax.lax.top_k(jax.random.gumbel(key, (high - low,)), k)[1]


def query_positions(key: jax.Array, start: int, seq_len: int, n: int, power_a: float) -> jax.Array:
    """n distinct even positions in [start, seq_len), near `start` with a power-law tail, in random order.

    Zoology's gaps: slot i (0-based) is drawn with p proportional to (i+1)^(a-1),
    without replacement. Shared with tasks/overwrite.py so the two query regions
    are drawn alike.
    """
    slots = (seq_len - start) // 2
    log_p = (power_a - 1.0) * jnp.log(jnp.arange(1, slots + 1, dtype=jnp.float32))
    gaps = jax.lax.top_k(log_p + jax.random.gumbel(key, (slots,)), n)[1]
    return (start + 2 * gaps).astype(jnp.int32)


def recall_sequence(key: jax.Array, context: jax.Array, query_pos: jax.Array, queried: jax.Array, seq_len: int,
              vocab: int, random_fill: bool) -> jax.Array:
    """The input tokens: `context` first, `queried[j]` at `query_pos[j]`, filler (random or 0) elsewhere."""
    queries = jnp.zeros(seq_len, jnp.int32).at[query_pos].set(queried)
    is_query = jnp.zeros(seq_len, bool).at[query_pos].set(True)
    filler = jax.random.randint(key, (seq_len,), 0, vocab) if random_fill else jnp.zeros(seq_len, jnp.int32)
    inputs = jnp.where(is_query, queries, filler)
    return inputs.at[:context.shape[0]].set(context).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class MQAR(TokenTask):
    vocab: int = 256
    seq_len: int = 64
    num_kv_pairs: int = 4
    power_a: float = 0.01
    num_passes: int = 1
    random_non_queries: bool = True
    heldout_size: int = 3000
    heldout_seed: int = 2**31 - 1
    distractor_pairs: int = 0
    distractor_place: str = "after"  # of the queried document: "before" or "after"

    name = "mqar"
    target_metric = "accuracy"  # train.target applies to eval/accuracy, higher is better
    higher_is_better = True

    def __post_init__(self):
        context = 2 * self.num_kv_pairs * self.num_passes + 2 * self.distractor_pairs
        check(
            # no pairs, or keys never shown: the task would train to chance and report completion
            (self.num_kv_pairs >= 1, "task.num_kv_pairs must be at least 1"),
            (self.num_passes >= 1, "task.num_passes must be at least 1 (each pair is shown that many times)"),
            (self.heldout_size >= 1, "task.heldout_size must be at least 1"),
            (self.seq_len % 2 == 0, "task.seq_len must be even"),
            (self.vocab > self.seq_len, "task.vocab must exceed task.seq_len"),
            (context + 2 * self.num_kv_pairs <= self.seq_len,
             "task.num_kv_pairs too large: need 2*kv*num_passes + 2*distractor_pairs + 2*kv <= seq_len"),
            (self.num_kv_pairs + self.distractor_pairs <= self.vocab // 2 - 1,
             "task.num_kv_pairs + task.distractor_pairs exceeds the key vocabulary V/2 - 1"),
            (self.distractor_pairs >= 0, "task.distractor_pairs must be at least 0"),
            (self.distractor_place in ("before", "after"), "task.distractor_place must be 'before' or 'after'"),
            (0 < self.power_a <= 1, "task.power_a must be in (0, 1]"),
        )

    def _example(self, key: jax.Array) -> Batch:
        kv, m, T, V = self.num_kv_pairs, self.distractor_pairs, self.seq_len, self.vocab
        k_keys, k_values, k_gaps, k_fill = jax.random.split(key, 4)
        keys = distinct(k_keys, 1, V // 2, kv + m)  # the distractor's keys and values: the last m, disjoint
        values = distinct(k_values, V // 2, V, kv + m)
        pairs = jnp.stack([keys, values], -1).reshape(-1)
        queried, distractor = jnp.tile(pairs[:2 * kv], self.num_passes), pairs[2 * kv:]
        before = self.distractor_place == "before"
        context = jnp.concatenate([distractor, queried] if before else [queried, distractor])
        keys, values = keys[:kv], values[:kv]
        C = context.shape[0]
        end = C if before else C - 2 * m  # where the queried document ends

        query_pos = query_positions(k_gaps, C, T, kv, self.power_a)
        inputs = recall_sequence(k_fill, context, query_pos, keys, T, V, self.random_non_queries)

        # Distance from the query back to the last copy of its key.
        key_pos = end - 2 * kv + 2 * jnp.arange(kv)
        return Batch(
            inputs=inputs,
            targets=values.astype(jnp.int32),
            mask=jnp.ones(kv, jnp.float32),
            positions=query_pos,
            meta={"distance": query_pos - key_pos},
        )

    def loss(self, logits, batch):
        return token_loss(logits, batch)
