"""MAD's in-context recall and noisy in-context recall (multi-query), sampled in pure JAX.

One example with seq_len T = 12 (k a key token, v its value, n noise)::

    sequence  k1 v1 k2 v2 n  n  k1 v1 k3 v3 | k2 v2       T tokens: T/2 - 1 pairs, then the probe pair
    inputs    the first T - 1 tokens
    targets   the last T - 1 tokens (next token at every position, as MAD trains)
    test                         [v1]         [v2]   the values of keys shown before, and the probe's

Keys are tokens [0, K) and values [K, vocab - noise_vocab_size), K half
the non-noise vocabulary; a key keeps one value within
a sequence (uniform over the values, not distinct across keys), and keys
repeat. Each body pair is, with probability `frac_noise`, two tokens of the
noise vocabulary (the last noise_vocab_size tokens) instead, except one pair
always kept. The probe is a key shown in the body, uniform over the distinct
keys shown, and its value. MAD's training targets are the next token at
every position (keys and first values are unpredictable noise to the loss);
its test scores only the values of keys shown before (`multi_query`), which
the context determines. `sample_heldout` gives that test mask; `sample` the
training one.

Where tmem differs from MAD: MAD's `generate_in_context_recall_instance`
draws values lazily at a key's first occurrence; here a table of every key's
value is drawn up front and looked up (the same distribution). The pair kept
free of noise is drawn among the T/2 - 1 body pairs (MAD draws among T/2,
and a sequence all noise would then fail to draw a probe). Only MAD's
benchmark setting, multi_query, is implemented (no copy-prefix token).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from tasks.base import Batch, check
from tasks.mad import MadTask


@dataclasses.dataclass(frozen=True)
class InContextRecall(MadTask):
    vocab: int = 16
    seq_len: int = 128  # MAD's seq_len: the model reads seq_len - 1 tokens
    noise_vocab_size: int = 0
    frac_noise: float = 0.0
    heldout_size: int = 1280
    heldout_seed: int = 2**31 - 1

    name = "mad_in_context_recall"

    def __post_init__(self):
        check(
            (self.seq_len % 2 == 0 and self.seq_len >= 4, "task.seq_len must be even and at least 4"),
            (self.vocab - self.noise_vocab_size >= 2,
             "task.vocab - task.noise_vocab_size must leave at least 2 tokens (a key and a value)"),
            (0 <= self.frac_noise < 1, "task.frac_noise must be in [0, 1)"),
            (self.frac_noise == 0 or self.noise_vocab_size > 0, "task.frac_noise > 0 needs task.noise_vocab_size > 0"),
            (self.heldout_size >= 1, "task.heldout_size must be at least 1"),
        )

    def _example(self, key: jax.Array, test: bool = False) -> Batch:
        T, V = self.seq_len, self.vocab
        plain = V - self.noise_vocab_size
        K, P = plain // 2, T // 2 - 1  # keys [0, K), values [K, plain); P pairs before the probe
        k_keys, k_table, k_noisy, k_kept, k_noise, k_probe = jax.random.split(key, 6)
        keys = jax.random.randint(k_keys, (P,), 0, K)
        table = jax.random.randint(k_table, (K,), K, plain)  # each key's value in this sequence
        noisy = (jax.random.uniform(k_noisy, (P,)) < self.frac_noise) & (
            jnp.arange(P) != jax.random.randint(k_kept, (), 0, P))
        pairs = jnp.stack([keys, table[keys]], -1)
        if self.noise_vocab_size:
            pairs = jnp.where(noisy[:, None], jax.random.randint(k_noise, (P, 2), plain, V), pairs)

        shown = jax.nn.one_hot(keys, K, dtype=jnp.int32) * (~noisy)[:, None].astype(jnp.int32)  # [P, K]
        earlier = jnp.cumsum(shown, 0) - shown  # how often each key was shown before pair j
        repeated = ~noisy & (jnp.take_along_axis(earlier, keys[:, None], 1)[:, 0] > 0)
        probe = jnp.argmax(jnp.where(shown.sum(0) > 0, jax.random.gumbel(k_probe, (K,)), -jnp.inf))
        sequence = jnp.concatenate([pairs.reshape(-1), jnp.stack([probe, table[probe]])]).astype(jnp.int32)

        # target t is sequence[t + 1]: pair j's value is target 2j, the probe's value the last target
        scored = jnp.zeros(T - 1, jnp.float32).at[0:2 * P:2].set(repeated.astype(jnp.float32)).at[T - 2].set(1.0)
        return Batch(inputs=sequence[:-1], targets=sequence[1:],
                     mask=scored if test else jnp.ones(T - 1, jnp.float32))


@dataclasses.dataclass(frozen=True)
class NoisyInContextRecall(InContextRecall):
    """In-context recall with noise pairs; MAD's baseline: 32 tokens, 16 of them noise, a fifth of pairs noise."""

    vocab: int = 32
    noise_vocab_size: int = 16
    frac_noise: float = 0.2

    name = "mad_noisy_in_context_recall"
