"""MAD's compression: read a random sequence into one vector, then rebuild every token from it.

One example with seq_len T = 6 (C the compression token)::

    input     a  b  c  d  e  C
    target    a  b  c  d  e  C     every position, from the encoding alone

The first T - 1 tokens are uniform over [0, V-1) and V-1 is the compression
token. The model is MAD's autoencoder (`head = "autoencoder"`, built by
tmem.autoencoder): the stack reads the sequence and its output at the last
position, the compression token, is the encoding; a small MLP decoder reads
the encoding plus a sinusoidal embedding of each position and predicts the
token there. So the whole sequence must pass through one vector of the model
width. Targets are the inputs (not shifted), the same for training and test.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from tasks.base import Batch, check
from tasks.mad import MadTask


@dataclasses.dataclass(frozen=True)
class Compression(MadTask):
    vocab: int = 16
    seq_len: int = 32
    heldout_size: int = 1280
    heldout_seed: int = 2**31 - 1

    name = "mad_compression"
    head = "autoencoder"  # tmem.model.build_model builds tmem.autoencoder.AutoEncoder for it

    def __post_init__(self):
        check(
            (self.vocab >= 2, "task.vocab must be at least 2 (a token and the compression token)"),
            (self.seq_len >= 2, "task.seq_len must be at least 2"),
            (self.heldout_size >= 1, "task.heldout_size must be at least 1"),
        )

    def _example(self, key: jax.Array, test: bool = False) -> Batch:
        T, V = self.seq_len, self.vocab
        inputs = jnp.append(jax.random.randint(key, (T - 1,), 0, V - 1), V - 1).astype(jnp.int32)
        return Batch(inputs=inputs, targets=inputs, mask=jnp.ones(T, jnp.float32))
