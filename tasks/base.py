"""What a task gives the trainer: a pure sampler, a fixed held-out set, a loss."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import optax
from flax import struct


@struct.dataclass
class Batch:
    """One batch of a task, all arrays.

    `targets` and `mask` are indexed like `positions` when the task scores only
    a few positions per sequence (the model then reads out logits only there,
    which for MQAR skips most of the unembedding); with `positions=None` they
    align with `inputs`. `meta` carries whatever probes need (for MQAR the
    distance from each query back to its key).
    """

    inputs: jax.Array  # [B, T] int32 tokens, or [B, T, D] float vectors
    targets: jax.Array  # [B, Q] or [B, T]
    mask: jax.Array  # same shape as targets, float32 weights (0 = not scored)
    positions: jax.Array | None = None  # [B, Q] int32 positions in inputs
    meta: dict[str, Any] = struct.field(default_factory=dict)


class Task(Protocol):
    """The interface every task implements (see tasks/mqar.py for one)."""

    name: str
    input_kind: str  # "tokens" or "vectors"
    layout: str  # "causal" (read left to right) or "prompt" (a set read at once, the query last)
    seq_len: int
    heldout_size: int
    heldout_seed: int
    target_metric: str  # the held-out metric train.target refers to
    higher_is_better: bool
    default_target: float | None  # train.target's value when the config leaves it to the task

    @property
    def vocab_size(self) -> int | None: ...  # None for vector tasks, which give token_dim instead

    def sample(self, key: jax.Array, batch_size: int) -> Batch: ...  # a training batch

    # Optional: `sample_heldout(key, batch_size)`, the held-out examples when they differ from training ones
    # (MAD's test sets score fewer positions, and fuzzy recall's test keys are always of the longest length).
    # Optional: `examples(keys)`, one example per key, where `sample(key, n)` is `examples(split(key, n))`: each
    # device of a data mesh then draws only its share of a batch (tasks.examples.draw_rows).
    # Optional: `metric_group`, the held-out examples a metric that is not a plain mean over them is computed over
    # at once (MAD's class-macro accuracy: its test batches of 128); the evaluation passes each device exactly
    # that many (tmem.train.step.make_eval).

    def loss(self, outputs: jax.Array, batch: Batch) -> tuple[jax.Array, dict[str, jax.Array]]: ...


@dataclasses.dataclass(frozen=True)
class Options:
    """Fields every task has (so `task.train_examples=...` needs no `+`), implemented once for all tasks."""

    # None: fresh examples every step; N: epochs of N fixed examples made from train.seed (tasks/examples.py)
    train_examples: int | None = dataclasses.field(default=None, kw_only=True)


class TokenTask(Options):
    """Shared by token tasks whose examples are drawn independently: `sample` vmaps `_example` over keys split from
    the batch's key, so any rows of a batch can be drawn alone (`examples`)."""

    input_kind = "tokens"
    layout = "causal"
    default_target = 0.99  # of the target accuracy

    @property
    def vocab_size(self) -> int:
        return self.vocab

    def sample(self, key: jax.Array, batch_size: int) -> Batch:
        return self.examples(jax.random.split(key, batch_size))

    def examples(self, keys: jax.Array) -> Batch:
        return jax.vmap(self._example)(keys)


def check(*conditions: tuple[bool, str]) -> None:
    """Raise the message of the first failing condition: a task's one-line config error."""
    for ok, message in conditions:
        if not ok:
            raise ValueError(message)


def heldout(task: Task) -> Batch:
    """The task's fixed held-out set: its own seed, never a training key (`sample_heldout` where a task has one)."""
    sample = getattr(task, "sample_heldout", task.sample)
    return sample(jax.random.key(task.heldout_seed), task.heldout_size)


def token_loss(logits: jax.Array, batch: Batch) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Cross-entropy and accuracy over the scored positions (mask-weighted means)."""
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.targets)
    weight = batch.mask.astype(jnp.float32)
    total = jnp.maximum(weight.sum(), 1.0)
    loss = (ce * weight).sum() / total
    correct = (jnp.argmax(logits, -1) == batch.targets).astype(jnp.float32)
    accuracy = (correct * weight).sum() / total
    return loss, {"loss": loss, "accuracy": accuracy}
