"""The task's held-out loss and metrics, on the task the eval reads.

Without task overrides this is the number training reported for the
checkpoint (chunks of the same size, weighted the same way); with them
(`task.seq_len=256 task.num_kv_pairs=32`) it is the basic measurement of
length generalisation: the trained model on longer sequences holding more
pairs, held out as training's set is (its own seed, never a training key).
"""

from __future__ import annotations

import jax
from flax import nnx

from tasks import heldout
from tmem.probes.base import Probe, ProbeInput
from tmem.train.build import evaluation_graphdef
from tmem.train.step import make_eval


def heldout_metrics(model, task, chunk: int | None = None) -> dict[str, float]:
    """Whatever `task.loss` returns on the held-out set, as means over the scored positions.

    Training's own evaluation (`make_eval`) in the mixer's evaluation form
    (the delta rows and GLA read in the token scan): chunks weighted by their
    scored positions, so a task whose metric is not a plain mean (MAD's
    class-macro accuracy) reads here as it did in training.
    """
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    graphdef = evaluation_graphdef(graphdef, params, rest)
    batch = jax.jit(heldout, static_argnums=0)(task)  # sampled as training samples it, compiled
    metrics = jax.jit(make_eval(graphdef, task, chunk))(params, rest, batch)
    return {name: float(value) for name, value in metrics.items()}


def run(inp: ProbeInput):
    """options.heldout.chunk: examples a device evaluates per pass (default the training loop's; for a MAD task
    that is its test batch of 128, the group its macro accuracy is computed over)."""
    task = inp.cfg.task
    chunk = inp.options.get("chunk")
    metrics = heldout_metrics(inp.model, task, None if chunk is None else int(chunk))
    return {**metrics, "examples": int(task.heldout_size), "seq_len": int(task.seq_len)}, {}


probe = Probe(
    run=run,
    description="the task's held-out loss and metrics (task.* overrides: on longer sequences, more pairs)",
)
