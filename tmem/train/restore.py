"""Restore a training run: its config, its model at a step, and its checkpoints over training.

The one place a run directory is read back. The eval frame, notebooks and
tests call `load_run`; a probe of training dynamics gets the run's `History`
through ProbeInput and never imports this module, so probes stay below the
eval frame that runs them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import jax
from flax import nnx
from omegaconf import OmegaConf

from tmem.config import ConfigError, validate
from tmem.train.build import build
from tmem.train.checkpoint import CheckpointError, Checkpoints
from tmem.train.rundir import saved_config


@dataclasses.dataclass(frozen=True)
class History:
    """A run's saved checkpoints, read one model at a time (formation over training)."""

    cfg: Any  # tmem.schema.Config of the run
    checkpoints: Checkpoints

    @property
    def steps(self) -> list[int]:
        return self.checkpoints.steps()

    def models(self, steps=None) -> Iterator[tuple[int, nnx.Module]]:
        """(step, model) for each listed step (default all), restored lazily: one model in memory at a time."""
        return checkpoint_models(self.cfg, self.checkpoints, steps)

    def metrics(self, step: int) -> dict:
        """The held-out metrics the training loop saved with that checkpoint (e.g. `eval/loss`)."""
        return self.checkpoints.metrics(step)


class Run(NamedTuple):
    """A restored run: its config, the model at `step`, and its whole history."""

    cfg: Any  # tmem.schema.Config
    model: nnx.Module
    step: int
    history: History


def load_run(run_dir: str | Path, step: int | None = None) -> Run:
    """The training run in `run_dir` at `step` (default the last), rebuilt from its own saved config."""
    cfg, ckpts = saved_run(run_dir)
    history = History(cfg, ckpts)
    (step, model), = history.models([ckpts.latest_step() if step is None else step])
    return Run(cfg, model, step, history)


def saved_run(run_dir: str | Path, step: int | None = None) -> tuple[Any, Checkpoints]:
    """A run directory's validated config and its checkpoints, read without restoring a model.

    CheckpointError in one line for a directory that holds no run, no
    checkpoint, no `step` (when given) or a config that no longer validates.
    """
    run_dir = Path(run_dir).absolute()
    if not run_dir.is_dir():
        raise CheckpointError(f"run={run_dir}: no such directory")
    if not (run_dir / "checkpoints").is_dir():
        raise CheckpointError(f"run={run_dir} has no checkpoints/ folder: point run= at a training run directory")
    ckpts = Checkpoints(run_dir / "checkpoints")
    if ckpts.latest_step() is None:
        raise CheckpointError(f"run={run_dir} has no checkpoint yet: train it first")
    try:
        resolved = saved_config(run_dir)  # in today's field names
    except ConfigError as e:
        raise CheckpointError(f"run={run_dir}: its saved config no longer validates: {e}") from None
    if resolved is None:
        raise CheckpointError(f"run={run_dir}: the checkpoint carries no config and .hydra/config.yaml is missing")
    if step is not None and step not in ckpts.steps():
        raise CheckpointError(f"no checkpoint at step {step} in {ckpts.directory}; have steps {ckpts.steps()}")
    try:
        return validate(OmegaConf.create(resolved)), ckpts
    except ConfigError as e:
        raise CheckpointError(f"run={run_dir}: its saved config no longer validates: {e}") from None


def checkpoint_models(cfg, ckpts: Checkpoints, steps=None) -> Iterator[tuple[int, nnx.Module]]:
    """(step, model) for each listed checkpoint step (default all), one restore at a time.

    The model is built once, by the function training built it with, so the
    saved state fits it, and reading a run's whole history costs one restore per step.
    """
    graphdef, initial, *_ = build(cfg)
    abstract = jax.eval_shape(lambda: initial)
    del initial  # only its shapes are needed: keep one model's arrays in memory, not two
    for step in ckpts.steps() if steps is None else steps:
        state = ckpts.restore(abstract, step)
        yield int(state.step), nnx.merge(graphdef, state.params, state.rest)
