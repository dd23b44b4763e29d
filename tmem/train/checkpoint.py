"""Checkpoints with orbax: train state per step, the config and metrics beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
from orbax.checkpoint import v1 as ocp

from tmem.train.step import TrainState


class CheckpointError(RuntimeError):
    """A run directory whose checkpoints cannot be read, in one line."""


class Checkpoints:
    """The run's `checkpoints/` folder: one orbax step directory per save.

    The resolved config is the folder's root metadata and each step carries
    its held-out metrics, so a checkpoint alone rebuilds its model.
    `keep=None` keeps every checkpoint, which probes of formation need.
    """

    def __init__(self, directory: Path, *, config: dict | None = None, keep: int | None = None):
        self.directory = Path(directory).absolute()  # orbax refuses relative paths
        policies = ocp.training.preservation_policies
        preservation = policies.PreserveAll() if keep is None else policies.LatestN(keep)
        self._ckpt = ocp.training.Checkpointer(
            self.directory, preservation_policy=preservation, custom_metadata=config)

    def save(self, state: TrainState, metrics: dict | None = None) -> None:
        step = int(state.step)
        if self.latest_step() != step:
            self._ckpt.save(step, state, metrics=_jsonable(metrics))

    def steps(self) -> list[int]:
        return sorted(c.step for c in self._ckpt.checkpoints)

    def latest_step(self) -> int | None:
        latest = self._ckpt.latest
        return None if latest is None else latest.step

    def restore(self, abstract: TrainState, step: int | None = None) -> TrainState:
        """Load a step (default the latest) into the shape of `abstract` on this host's device."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        if step not in self.steps():
            raise CheckpointError(f"no checkpoint at step {step} in {self.directory}; have steps {self.steps()}")
        # Without a sharding on the target, orbax recreates the saving host's
        # device layout and fails elsewhere (a GPU checkpoint on a CPU host).
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        target = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device), abstract)
        try:
            return self._ckpt.load(step, target)
        except Exception as e:  # orbax raises many types; name the folder, keep the cause chained
            cause = str(e).strip().splitlines()[0][:160]
            raise CheckpointError(
                f"cannot restore step {step} from {self.directory}: its saved state does not fit this config "
                f"(was the model or optimizer config changed since?) [{type(e).__name__}: {cause}]") from e

    def metrics(self, step: int) -> dict:
        return dict(self._ckpt.metadata(step).metrics or {})

    def config(self) -> dict | None:
        return self._ckpt.root_metadata().custom_metadata

    def close(self) -> None:
        self._ckpt.close()


def _jsonable(metrics: dict | None) -> dict[str, Any] | None:
    return None if metrics is None else {k: (None if v is None else float(v)) for k, v in metrics.items()}
