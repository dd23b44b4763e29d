"""What a probe is: a function of a trained model (or of nothing) to metrics and figures."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

import jax


@dataclasses.dataclass
class ProbeInput:
    """What the eval frame hands a probe.

    `model` and `cfg` are None for probes that need no trained model;
    `history` lets a probe read the run's checkpoints over training (formation)
    as `history.steps`, `history.models(steps)` and `history.metrics(step)`,
    without importing the training code that restores them.
    """

    cfg: Any = None  # tmem.schema.Config of the run
    model: Any = None  # the restored LM
    step: int | None = None
    key: jax.Array | None = None
    run_dir: Path | None = None
    history: Any = None  # tmem.train.restore.History of the run, or None
    options: dict = dataclasses.field(default_factory=dict)  # eval.yaml's `options.<probe>`


@dataclasses.dataclass(frozen=True)
class Probe:
    """`run(input) -> (metrics, figures)`: a JSON-able dict and {name: matplotlib Figure}.

    `applies(cfg)` returns None when the probe can read this run, else the reason it cannot.
    """

    run: Callable[[ProbeInput], tuple[dict, dict]]
    needs_run: bool = True
    applies: Callable[[Any], str | None] = lambda cfg: None
    description: str = ""


def mixers_without(cfg, has: Callable[[Any], bool]) -> str | None:
    """The mixers of a run's layers whose config lacks what a probe reads, `has(config)` false ("a+b" for a
    hybrid's), else None: a probe that reads one kind of layer in every layer names what it cannot read."""
    others = [layer.name for layer in cfg.layers if not has(layer)]
    return "+".join(dict.fromkeys(others)) if others else None


def memorize_alone(cfg) -> str | None:
    """Why a run is not the slow memory alone (a memorize task read by a model without a mixer, so each fact
    reads its own token), or None: what the probes of stored facts need."""
    if cfg.task.name != "memorize":
        return f"needs a memorize run, not {cfg.task.name!r}"
    if others := mixers_without(cfg, lambda m: not m.mixes):
        return f"needs a model without a mixer (mixer=none), whose facts read their token alone, not {others!r}"
    return None
