"""What a config builds for training: the model's initial train state, its optimizer and schedule.

Training, restoring a checkpoint and the speed benchmarks all start here, so
the model they train, restore into or time is built one way: the same seed
for the parameters and the batch key, the same order of draws, the same
optimizer. A checkpoint restores only into the state this builds.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import optax
from flax import nnx

from tmem.mixers.base import MixerConfig
from tmem.model import build_model
from tmem.schema import Config
from tmem.train.optim import build_optimizer, learning_rate
from tmem.train.step import TrainState, init_state


class Built(NamedTuple):
    """A run's starting point: `state` holds every array, `graphdef` the model's structure."""

    graphdef: Any  # nnx.GraphDef of the model
    state: TrainState  # step 0: initial parameters, optimizer state, the run's base key
    tx: optax.GradientTransformation
    schedule: optax.Schedule  # the learning rate by step, for the logs (tx applies it itself)

    @property
    def model(self) -> nnx.Module:
        """The model on the state's arrays (shared, not copied: a step that donates the state deletes them)."""
        return nnx.merge(self.graphdef, self.state.params, self.state.rest)


def build(cfg: Config, seed: int | None = None) -> Built:
    """The model, optimizer and initial state a config describes, at `seed` (default train.seed).

    The seed draws the parameters and is the base key of the batches, as a
    run with train.seed=seed would use it.
    """
    seed = cfg.train.seed if seed is None else seed
    model = build_model(cfg, cfg.task, seed)
    tx = build_optimizer(cfg.optim, cfg.decay_end)
    graphdef, state = init_state(model, tx, seed)
    return Built(graphdef, state, tx, learning_rate(cfg.optim, cfg.decay_end))


def evaluation_graphdef(graphdef: Any, params: Any, rest: Any) -> Any:
    """The structure the held-out evaluation reads these parameters through: `graphdef` with each mixer layer
    that evaluates in another form of the same function (MixerConfig.for_evaluation) switched to it, the same
    parameters under the same names; `graphdef` itself if none does.

    Read from the model, not rebuilt from a config, so that a model read on another task than it trained on
    (eval.py's task overrides) keeps the structure it has. The arrays are shared, not copied.
    """
    model = nnx.merge(graphdef, params, rest)
    layers = [node for _, node in nnx.iter_graph(model) if isinstance(getattr(node, "cfg", None), MixerConfig)]
    switched = [layer for layer in layers if layer.cfg.for_evaluation() != layer.cfg]
    if not switched:
        return graphdef
    for layer in switched:
        layer.cfg = layer.cfg.for_evaluation()
    return nnx.split(model, nnx.Param, ...)[0]
