"""Repeated segments: the task that grows induction heads.

One example with T = 16, a segment of period n = 4 starting at s = 3
(B the reserved BOS token 0, . a random token, a b c d the segment)::

    position  0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15
    input     B  .  .  a  b  c  d  a  b  c  d  .  .  .  .  .
    target    .  .  a  b  c  d  a [b  c  d] .  .  .  .  .  .

Every sequence starts with BOS, so training inputs look like the probe's
[BOS] + R + R. The period n and the start s vary per example (n in
[min_period, max_period]), so no head can pass by attending a fixed distance
back. Only the bracketed targets (the second copy after its first token, n - 1
of them) are predictable; `loss_on` picks whether the loss counts those alone
or every position. The sequence is drawn with T + 1 tokens so every input
position has a target.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from tasks.base import Batch, TokenTask, check, token_loss

BOS = 0


@dataclasses.dataclass(frozen=True)
class Repeat(TokenTask):
    vocab: int = 64
    seq_len: int = 64
    min_period: int = 8
    max_period: int = 32
    loss_on: str = "second_copy"  # second_copy (the predictable targets only) | all
    heldout_size: int = 512
    heldout_seed: int = 2**31 - 1

    name = "repeat"
    target_metric = "copy_accuracy"  # accuracy on the predictable second-copy targets
    higher_is_better = True

    def __post_init__(self):
        check(
            (self.vocab >= 3, "task.vocab must be at least 3 (BOS and two tokens)"),
            (self.heldout_size >= 1, "task.heldout_size must be at least 1"),
            (2 <= self.min_period <= self.max_period, "task.min_period must be in [2, task.max_period]"),
            (2 * self.max_period <= self.seq_len, "task.max_period too large: need 2 * max_period <= seq_len"),
            (self.loss_on in ("second_copy", "all"), "task.loss_on must be one of: second_copy, all"),
        )

    def _example(self, key: jax.Array) -> Batch:
        T = self.seq_len
        k_tokens, k_period, k_start = jax.random.split(key, 3)
        z = jax.random.randint(k_tokens, (T + 1,), 1, self.vocab).at[0].set(BOS)
        n = jax.random.randint(k_period, (), self.min_period, self.max_period + 1)
        s = jax.random.randint(k_start, (), 1, T - 2 * n + 2)  # the second copy ends at z[T] at the latest
        i = jnp.arange(T + 1)
        z = z[jnp.where((i >= s + n) & (i < s + 2 * n), i - n, i)]
        t = jnp.arange(T)
        copy = ((t >= s + n) & (t <= s + 2 * n - 2)).astype(jnp.float32)  # target z[t+1] is in the second copy
        mask = copy if self.loss_on == "second_copy" else jnp.ones(T, jnp.float32)
        return Batch(inputs=z[:T].astype(jnp.int32), targets=z[1:].astype(jnp.int32), mask=mask,
                     meta={"period": n, "start": s, "copy": copy})

    def loss(self, logits, batch):
        loss, metrics = token_loss(logits, batch)
        _, copy = token_loss(logits, batch.replace(mask=batch.meta["copy"]))
        return loss, {**metrics, "copy_loss": copy["loss"], "copy_accuracy": copy["accuracy"]}
