"""What MAD's six tasks share: train and test examples from one sampler, the loss, MAD's class-macro accuracy.

MAD (Poli et al. 2024, athms/mad-lab) generates a training set and a test set
with the same instance function and a flag, `is_training`, which changes what
is scored (the recall tasks train on every next token but test only the
recalled values) and, for fuzzy recall, the keys. Here `_example(key, test)`
is that function: `sample` draws training examples, `sample_heldout` test
ones (tasks.base.heldout uses it), and the held-out metrics are MAD's test
metrics. MAD's defaults: 12,800 training examples (`train_examples`, cycled
for 200 epochs), 1,280 test examples, training stopped at 0.999 test
accuracy.

MAD scores a setting by torchmetrics' `MulticlassAccuracy` with its default
macro average (the mean over classes of each class's recall), not by token
accuracy; `macro_accuracy` is that metric. MAD computes it per batch of 128
and Lightning averages the batches; tmem's held-out evaluation computes it
over the same batches of 128 held-out examples (`metric_group`), on any
number of devices, and averages them weighted by their scored positions.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from tasks.base import Batch, TokenTask, token_loss


@dataclasses.dataclass(frozen=True)
class MadTask(TokenTask):
    """A MAD task: `_example(key, test)` gives one example, training or test."""

    # MAD's baseline training set: 12,800 examples (its harder settings: 6,400 down to 800); null samples afresh
    train_examples: int | None = dataclasses.field(default=12800, kw_only=True)

    target_metric = "accuracy"  # held-out token accuracy on MAD's test positions
    metric_group = 128  # MAD's test batch: its macro accuracy is a batch's, averaged over the batches
    higher_is_better = True
    default_target = 0.999  # MAD stops a run at this test accuracy

    def sample_heldout(self, key: jax.Array, batch_size: int) -> Batch:
        return jax.vmap(functools.partial(self._example, test=True))(jax.random.split(key, batch_size))

    def loss(self, logits, batch):
        loss, metrics = token_loss(logits, batch)
        return loss, {**metrics, "macro_accuracy": macro_accuracy(logits, batch.targets, batch.mask)}


def macro_accuracy(logits: jax.Array, targets: jax.Array, mask: jax.Array) -> jax.Array:
    """torchmetrics' multiclass accuracy, macro-averaged, over the positions where mask > 0.

    Each class's score is its recall, tp / (tp + fn), 0 for a class no target
    holds; the mean is over the classes with any tp, fp or fn, so a class that
    is only ever predicted wrongly counts as 0 and a class never seen nor
    predicted does not count (torchmetrics' rule; its docstring example,
    predictions [2, 1, 0, 1] against targets [2, 1, 0, 0], gives 0.8333).
    """
    classes = logits.shape[-1]
    scored = (mask > 0).ravel().astype(jnp.float32)
    truth, guess = targets.ravel(), jnp.argmax(logits, -1).ravel()
    hit = scored * (guess == truth)
    tp = jax.ops.segment_sum(hit, truth, classes)
    support = jax.ops.segment_sum(scored, truth, classes)  # tp + fn
    predicted = jax.ops.segment_sum(scored, guess, classes)  # tp + fp
    counted = ((support + predicted - tp) > 0).astype(jnp.float32)  # tp + fp + fn > 0
    recall = tp / jnp.maximum(support, 1.0)
    return (counted * recall).sum() / jnp.maximum(counted.sum(), 1.0)
