"""Pattern completion: the Hopfield setting of the note's Chapter 6, as a token task.

The context stores P random patterns of L tokens each. A cue follows: one of
the stored patterns, chosen at random, with round(corruption * L) of its
entries (positions drawn without replacement) replaced by other tokens. The
model must then give the whole stored pattern back. A Hopfield network does
this by moving the cue to the nearest stored pattern; a model that only
copies the cue gets the intact entries and misses every corrupted one, which
`accuracy_corrupted` shows apart. Copying the intact entries and taking the
rest from a stored pattern picked at random scores 1/P on the corrupted
entries: the level a model that has not learned to match the cue sits at.

Layout of one example with P = 3, L = 4 and one corrupted entry (S the
separator, R the recall token; the cue is the second pattern with its third
entry changed from c to x)::

    position  0  1  2  3  4  | 5  6  7  8  9  | 10 11 12 13 14 | 15 16 17 18 | 19 20 21 22
    input     e  f  g  h  S  | a  b  c  d  S  | i  j  k  l  S  | a  b  x  d  | R  R  R  R
    target                   |                |                |             | a  b  c  d
              pattern 1        pattern 2        pattern 3        cue           recall

The answer is read at L positions holding the reserved recall token rather
than teacher-forced as next-token targets. Teacher forcing (the true pattern
written out after the cue, each next token scored) would leak the answer
token by token: after its first entry or two, the stored pattern is found by
its correct prefix and the rest is a copy, whatever the cue said. The recall
tokens are all alike, their positions the only difference, so every entry has
to come from the cue.

Token 0 is the separator, 1 the recall token, and pattern entries (stored and
replacement alike) come uniformly from [2, V). Patterns are drawn
independently, so two may share entries or even coincide; `meta["decodable"]`
says whether the nearest stored pattern to the cue, in Hamming distance, is
the right answer (every stored pattern at least as near equals it): the
fraction of decodable examples is the exact match of a perfect
nearest-pattern rule. `meta["which"]` is the cued
pattern's index and `meta["corrupted"]` marks the corrupted entries.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from tasks.base import Batch, TokenTask, check, token_loss
from tasks.mqar import distinct

SEPARATOR, RECALL = 0, 1


@dataclasses.dataclass(frozen=True)
class Patterns(TokenTask):
    vocab: int = 32  # two reserved tokens and V - 2 pattern tokens
    num_patterns: int = 4
    pattern_len: int = 8
    corruption: float = 0.25  # the fraction of the cue's entries replaced, rounded to a whole number
    heldout_size: int = 1000
    heldout_seed: int = 2**31 - 1

    name = "patterns"
    target_metric = "accuracy"  # per entry; exact_match is the stricter whole-pattern figure
    higher_is_better = True

    def __post_init__(self):
        check(
            (self.vocab >= 4, "task.vocab must be at least 4 (separator, recall and two pattern tokens)"),
            (self.num_patterns >= 1, "task.num_patterns must be at least 1"),
            (self.pattern_len >= 1, "task.pattern_len must be at least 1"),
            (0 <= self.corruption <= 1, "task.corruption must be in [0, 1]"),
            # a cue with no intact entry says nothing about which pattern to recall
            (self.num_corrupted < self.pattern_len,
             "task.corruption too large: round(corruption * pattern_len) must leave an entry of the cue intact"),
            (self.heldout_size >= 1, "task.heldout_size must be at least 1"),
        )

    @property
    def num_corrupted(self) -> int:
        """How many of the cue's entries are replaced (Python's round: halves go to the even number)."""
        return round(self.corruption * self.pattern_len)

    @property
    def seq_len(self) -> int:
        P, L = self.num_patterns, self.pattern_len
        return P * (L + 1) + 2 * L

    def _example(self, key: jax.Array) -> Batch:
        P, L, V, c = self.num_patterns, self.pattern_len, self.vocab, self.num_corrupted
        k_patterns, k_which, k_where, k_shift = jax.random.split(key, 4)
        patterns = jax.random.randint(k_patterns, (P, L), 2, V)
        which = jax.random.randint(k_which, (), 0, P)
        target = patterns[which]

        corrupted = jnp.zeros(L, bool).at[distinct(k_where, 0, L, c)].set(True)
        # a nonzero shift modulo the V - 2 pattern tokens: the replacement always differs from the entry
        shift = jax.random.randint(k_shift, (L,), 1, V - 2)
        cue = jnp.where(corrupted, 2 + (target - 2 + shift) % (V - 2), target)

        stored = jnp.concatenate([patterns, jnp.full((P, 1), SEPARATOR, patterns.dtype)], 1).reshape(-1)
        inputs = jnp.concatenate([stored, cue, jnp.full(L, RECALL, patterns.dtype)])

        distance = (patterns != cue[None]).sum(1)
        nearest_is_right = (distance > distance[which]) | (patterns == target[None]).all(1)
        return Batch(
            inputs=inputs.astype(jnp.int32),
            targets=target.astype(jnp.int32),
            mask=jnp.ones(L, jnp.float32),
            positions=(P * (L + 1) + L + jnp.arange(L)).astype(jnp.int32),
            meta={"which": which, "corrupted": corrupted, "decodable": nearest_is_right.all()},
        )

    def loss(self, logits, batch):
        """token_loss's loss and per-entry accuracy, whole-pattern exact match, and accuracy on corrupted entries.

        An example counts toward exact_match when any of its entries is scored
        (the held-out evaluation pads with unscored rows); it matches when every
        scored entry is right.
        """
        loss, metrics = token_loss(logits, batch)
        right = jnp.argmax(logits, -1) == batch.targets
        scored = batch.mask > 0
        counted = scored.any(-1).astype(jnp.float32)
        matched = (right | ~scored).all(-1).astype(jnp.float32) * counted
        metrics["exact_match"] = matched.sum() / jnp.maximum(counted.sum(), 1.0)
        if self.num_corrupted > 0:
            weight = batch.meta["corrupted"].astype(jnp.float32) * batch.mask
            metrics["accuracy_corrupted"] = (right * weight).sum() / jnp.maximum(weight.sum(), 1.0)
        return loss, metrics
