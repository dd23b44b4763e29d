"""Bigram sequences with triggers (Bietti et al. 2023, "Birth of a Transformer").

Tokens follow a fixed bigram Markov chain, except after a trigger: each
sequence draws K trigger tokens and one output token for each, and a trigger
is always followed by its output in that sequence. The chain is global (the
slow memory learns it); the trigger outputs change per sequence, so the
second and later occurrences of a trigger are predictable only in context,
by an induction head::

    input     B  u  v  q  o  w  x  q [o] y ...     q a trigger, o its output
    target       v  q  o  w  x  q  o  y ...     [o] predictable: q seen before

A random Dirichlet(alpha) bigram matrix, drawn from `bigram_seed`, stands in
for the paper's character-level Shakespeare statistics; its stationary
distribution stands in for their unigram, from which the first token and the
triggers (distinct) are drawn. Outputs are uniform over the tokens, as in the
paper's default. Token 0 is the reserved BOS that starts every sequence.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from tasks.base import Batch, TokenTask, check, token_loss
from tasks.repeat import BOS


@dataclasses.dataclass(frozen=True)
class Triggers(TokenTask):
    vocab: int = 64
    seq_len: int = 128
    num_triggers: int = 3
    dirichlet_alpha: float = 0.1
    bigram_seed: int = 0
    loss_on: str = "outputs"  # outputs (later occurrences of trigger outputs only) | all
    heldout_size: int = 512
    heldout_seed: int = 2**31 - 1

    name = "triggers"
    target_metric = "output_accuracy"  # accuracy on the in-context predictable outputs
    higher_is_better = True

    def __post_init__(self):
        check(
            (self.vocab >= 3, "task.vocab must be at least 3 (BOS and two tokens)"),
            (self.heldout_size >= 1, "task.heldout_size must be at least 1"),
            (1 <= self.num_triggers < self.vocab - 1, "task.num_triggers must be in [1, vocab - 2]"),
            (self.dirichlet_alpha > 0, "task.dirichlet_alpha must be positive"),
            (self.seq_len >= 2, "task.seq_len must be at least 2"),
            (self.loss_on in ("outputs", "all"), "task.loss_on must be one of: outputs, all"),
        )

    @functools.cached_property
    def bigram(self) -> np.ndarray:
        """[V-1, V-1] transition matrix over tokens 1..V-1 (row: previous token), fixed by bigram_seed."""
        n = self.vocab - 1
        rows = np.random.default_rng(self.bigram_seed).dirichlet(np.full(n, self.dirichlet_alpha), size=n)
        # Small alphas underflow to exact zeros; a floor keeps the chain irreducible and log-finite.
        rows = np.maximum(rows, 1e-8)
        return rows / rows.sum(1, keepdims=True)

    @functools.cached_property
    def unigram(self) -> np.ndarray:
        """The chain's stationary distribution (power iteration from uniform)."""
        p = np.full(self.vocab - 1, 1.0 / (self.vocab - 1))
        for _ in range(10_000):
            nxt = p @ self.bigram
            if np.abs(nxt - p).max() < 1e-12:
                break
            p = nxt
        return nxt / nxt.sum()

    def _example(self, key: jax.Array) -> Batch:
        T, V, K = self.seq_len, self.vocab, self.num_triggers
        log_bigram = jnp.asarray(np.log(self.bigram), jnp.float32)
        log_unigram = jnp.asarray(np.log(self.unigram), jnp.float32)
        k_trig, k_out, k_first, k_chain = jax.random.split(key, 4)
        triggers = 1 + jax.lax.top_k(log_unigram + jax.random.gumbel(k_trig, (V - 1,)), K)[1]
        outputs = jax.random.randint(k_out, (K,), 1, V)
        first = 1 + jax.random.categorical(k_first, log_unigram)

        def step(prev, g):
            hit = prev == triggers
            nxt = jnp.where(hit.any(), outputs[jnp.argmax(hit)], 1 + jnp.argmax(log_bigram[prev - 1] + g))
            return nxt, nxt

        # T + 1 tokens in all: BOS, the first token, then T - 1 steps of the chain.
        _, rest = jax.lax.scan(step, first, jax.random.gumbel(k_chain, (T - 1, V - 1)))
        z = jnp.concatenate([jnp.array([BOS]), first[None], rest]).astype(jnp.int32)
        x = z[:T]
        is_trigger = x[:, None] == triggers[None]  # [T, K]
        seen = jnp.cumsum(is_trigger, axis=0)  # occurrences up to and including t
        predictable = (is_trigger & (seen >= 2)).any(-1).astype(jnp.float32)  # target z[t+1] known in context
        mask = predictable if self.loss_on == "outputs" else jnp.ones(T, jnp.float32)
        return Batch(inputs=x, targets=z[1:], mask=mask,
                     meta={"triggers": triggers, "outputs": outputs, "predictable": predictable})

    def loss(self, logits, batch):
        loss, metrics = token_loss(logits, batch)
        _, out = token_loss(logits, batch.replace(mask=batch.meta["predictable"]))
        return loss, {**metrics, "output_loss": out["loss"], "output_accuracy": out["accuracy"]}
