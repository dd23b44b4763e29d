"""Checkpoints with orbax: train state per step, the config and metrics beside it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
from orbax.checkpoint import v1 as ocp

from tmem.train.step import TrainState

# orbax's layout of a step directory: a finished step holds this file, and its two checkpointables
FINISHED, STATE, METRICS = "_CHECKPOINT_METADATA", "state", "metrics"


class CheckpointError(RuntimeError):
    """A run directory whose checkpoints cannot be read, in one line."""


class Checkpoints:
    """The run's `checkpoints/` folder: one orbax step directory per save.

    The resolved config is the folder's root metadata and each step carries
    its held-out metrics, so a checkpoint alone rebuilds its model.
    `keep=None` keeps every checkpoint, which probes of formation need.

    Reading goes step by step (orbax's `load` of one step's state, its small
    JSON files read by name), so one damaged step leaves the others readable;
    orbax's training checkpointer, which reads every step's metrics when it
    starts, is made only to save, after those have been checked.
    """

    def __init__(self, directory: Path, *, config: dict | None = None, keep: int | None = None):
        self.directory = Path(directory).absolute()  # orbax refuses relative paths
        self._config, self._keep, self._writer = config, keep, None

    def _checkpointer(self) -> ocp.training.Checkpointer:
        if self._writer is None:
            for step in self.steps():  # orbax would stop at a damaged one with a bare JSONDecodeError
                self.metrics(step)
            policies = ocp.training.preservation_policies
            preservation = policies.PreserveAll() if self._keep is None else policies.LatestN(self._keep)
            self._writer = ocp.training.Checkpointer(
                self.directory, preservation_policy=preservation, custom_metadata=self._config)
        return self._writer

    def save(self, state: TrainState, metrics: dict | None = None) -> None:
        step = int(state.step)
        if self.latest_step() != step:
            self._checkpointer().save(step, state, metrics=_jsonable(metrics))

    def steps(self) -> list[int]:
        """The finished steps on disk (a save cut short leaves none of orbax's finished-step marker)."""
        if not self.directory.is_dir():
            return []
        return sorted(int(p.name) for p in self.directory.iterdir() if p.name.isdigit() and (p / FINISHED).is_file())

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

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
            return ocp.load(self.directory / str(step), target, checkpointable_name=STATE)
        except Exception as e:  # orbax raises many types; name the folder, keep the cause chained
            raise self._why_not(step, e) from e

    def _why_not(self, step: int, error: Exception) -> CheckpointError:
        """A config change if the step loads as it was saved, else damage on disk."""
        cause = f"[{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:160]}]"
        folder = self.directory / str(step)
        try:
            ocp.load(folder, checkpointable_name=STATE)  # no target: the tree as saved
        except Exception:
            others = [s for s in self.steps() if s != step]
            fallback = (f"the other steps ({others}) are separate: restore one of them (eval.py ... step=N), or "
                        f"move {folder} aside to resume from the latest of them" if others else "no other step is saved")
            return CheckpointError(f"step {step} in {self.directory} is damaged: its files cannot be read {cause}; "
                                   f"{fallback}")
        return CheckpointError(f"cannot restore step {step} from {self.directory}: its saved state does not fit this "
                               f"config (was the model or optimizer config changed since?) {cause}")

    def metrics(self, step: int) -> dict:
        """The held-out metrics saved with a step ({} if it was saved without)."""
        path = self.directory / str(step) / METRICS / METRICS
        return dict(_read_json(path, f"the held-out metrics of step {step}") or {}) if path.exists() else {}

    def config(self) -> dict | None:
        path = self.directory / "metadata" / "_ROOT_METADATA"
        return _read_json(path, "the run's config").get("custom_metadata") if path.exists() else None

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path} ({what}) cannot be read: {type(e).__name__}: {e}; move its step "
                              "folder aside to use the other steps") from e


def _jsonable(metrics: dict | None) -> dict[str, Any] | None:
    return None if metrics is None else {k: (None if v is None else float(v)) for k, v in metrics.items()}
