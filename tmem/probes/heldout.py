"""The task's held-out loss and metrics, on the task the eval reads.

Without task overrides this is the number training reported for the
checkpoint (chunks of the same size, weighted the same way); with them
(`task.seq_len=256 task.num_kv_pairs=32`) it is the basic measurement of
length generalisation: the trained model on longer sequences holding more
pairs, held out as training's set is (its own seed, never a training key).
"""

from __future__ import annotations

import functools

import jax
from flax import nnx

from tasks import heldout
from tmem.probes.base import Probe, ProbeInput

CHUNK = 100  # examples per forward pass: the training loop's held-out chunk, so the weighting matches


def heldout_metrics(model, task, chunk: int = CHUNK) -> dict[str, float]:
    """Whatever `task.loss` returns on the held-out set, as means over the scored positions.

    Each chunk's metrics are weighted by its scored positions (the mask's sum),
    the rule training's held-out evaluation uses, so a task whose metric is not
    a plain mean (MAD's class-macro accuracy) reads here as it did in training.
    """
    graphdef, state = nnx.split(model)
    batch = jax.jit(heldout, static_argnums=0)(task)  # sampled as training samples it, compiled
    n = batch.inputs.shape[0]
    sums, total = {}, 0.0
    for i in range(0, n, chunk):
        part = jax.tree.map(lambda x: x[i:i + chunk] if x.ndim and x.shape[0] == n else x, batch)
        metrics, weight = jax.device_get(_chunk_metrics(graphdef, task, state, part))
        for name, value in metrics.items():
            sums[name] = sums.get(name, 0.0) + float(value) * float(weight)
        total += float(weight)
    return {name: value / max(total, 1.0) for name, value in sums.items()}


@functools.partial(jax.jit, static_argnums=(0, 1))
def _chunk_metrics(graphdef, task, state, batch):
    """One chunk's metrics and weight; compiled once per model structure, task and chunk shape."""
    outputs = nnx.merge(graphdef, state)(batch.inputs, positions=batch.positions)
    return task.loss(outputs, batch)[1], batch.mask.sum()


def run(inp: ProbeInput):
    """options.heldout.chunk: examples per forward pass (default 100)."""
    task = inp.cfg.task
    metrics = heldout_metrics(inp.model, task, int(inp.options.get("chunk", CHUNK)))
    return {**metrics, "examples": int(task.heldout_size), "seq_len": int(task.seq_len)}, {}


probe = Probe(
    run=run,
    description="the task's held-out loss and metrics (task.* overrides: on longer sequences, more pairs)",
)
