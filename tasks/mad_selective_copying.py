"""MAD's selective copying: copy the n tokens scattered among blanks, in order, after a copy token.

One example with seq_len T = 12 and n = 3 tokens to copy (a b c; _ blank, C the copy token)::

    position  0  1  2  3  4  5  6  7  8  9 10 11
    input     _  a  _  b  _  _  c  _  C  _  _  _
    target                                a  b  c     only the last n positions are scored

The tokens to copy are uniform over [0, V-2) with repeats; V-2 is the blank
and V-1 the copy token. Each of the T - 2n - 1 blanks goes before one of the
n tokens, chosen uniformly (numpy's `insert` at indices in [0, n), as MAD
does), so no blank follows the last token. The target at the i-th of the
final blanks is the i-th token: MAD's targets, the same for training and
test; they are not next-token targets and no copied token is fed back.
The batch scores only those n positions (`positions`), so the model's last
block reads out only there.

Where tmem differs from MAD (`generate_copying_instance`): MAD draws the
blanks' places from numpy's global generator, not the instance's `rng`, so
its examples do not follow from its seed; here every draw comes from the
example's own key.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from tasks.base import Batch, check
from tasks.mad import MadTask


@dataclasses.dataclass(frozen=True)
class SelectiveCopying(MadTask):
    vocab: int = 16
    seq_len: int = 256
    num_tokens_to_copy: int = 16
    heldout_size: int = 1280
    heldout_seed: int = 2**31 - 1

    name = "mad_selective_copying"

    def __post_init__(self):
        check(
            (self.vocab >= 3, "task.vocab must be at least 3 (a token, the blank and the copy token)"),
            (self.num_tokens_to_copy >= 1, "task.num_tokens_to_copy must be at least 1"),
            (self.seq_len > 2 * self.num_tokens_to_copy + 1, "task.seq_len must exceed 2 * task.num_tokens_to_copy + 1"),
            (self.heldout_size >= 1, "task.heldout_size must be at least 1"),
        )

    def _example(self, key: jax.Array, test: bool = False) -> Batch:
        T, V, n = self.seq_len, self.vocab, self.num_tokens_to_copy
        blank, copy = V - 2, V - 1
        k_tokens, k_gaps = jax.random.split(key)
        tokens = jax.random.randint(k_tokens, (n,), 0, V - 2)
        gap = jax.random.randint(k_gaps, (T - 2 * n - 1,), 0, n)  # each blank goes before token `gap`
        place = jnp.arange(n) + jnp.cumsum(jnp.bincount(gap, length=n))  # token i follows the blanks before it
        data = jnp.full(T - n - 1, blank, jnp.int32).at[place].set(tokens)
        inputs = jnp.concatenate([data, jnp.array([copy], jnp.int32), jnp.full(n, blank, jnp.int32)])
        return Batch(inputs=inputs, targets=tokens.astype(jnp.int32), mask=jnp.ones(n, jnp.float32),
                     positions=jnp.arange(T - n, T, dtype=jnp.int32))
