"""What a run really ran: the layer and knobs its mixer resolved to, the recipe, the devices and the versions.

`.hydra/config.yaml` records the command's knobs, not what they became: a
`mixer=regression` SGD cell's record says `mini_batch: 16` and runs with 1,
`optim.lr: null` trains at the row's rate, `train.microbatch: auto` at the
row's slice. `run_record` builds the facts from the validated Config and the
live machine, one pure function; the Trainer writes them to
`<run>/resolved.yaml` when a session starts (so a crashed run has them) and
into `summary.json` as nested sections, which a sweep's gatherer flattens
into dotted columns.
"""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess
from pathlib import Path

import yaml

from tmem.config import plain
from tmem.mixers import layer_of
from tmem.schema import Config
from tmem.train.record import write_atomically

RESOLVED = "resolved.yaml"
# the distributions whose versions a run records, by the name the record gives them
DISTRIBUTIONS = {"jax": "jax", "jaxlib": "jaxlib", "flax": "flax", "optax": "optax", "orbax": "orbax-checkpoint",
                 "tmem": "tmem"}


def run_record(cfg: Config, hardware: dict, versions: dict) -> dict:
    """The resolved run: `resolved` (the mixer's layer by import path, the mixer and model configs with every
    "auto" and every cell's knob resolved), `recipe` (the optimizer settings after the row's recommendations),
    and the live `hardware` (`hardware_of`) and `versions` (`versions_of`) it was given."""
    layer = layer_of(cfg.mixer)
    return {"resolved": {"layer": f"{layer.__module__}.{layer.__qualname__}", "mixer": plain(cfg.mixer),
                         "model": plain(cfg.model)},
            "recipe": recipe(cfg), "hardware": hardware, "versions": versions}


def recipe(cfg: Config) -> dict:
    """The training settings as used: the rate and weight decay after the row's recommendations, the step the
    decay ends at, the microbatch after `auto`."""
    o, t = cfg.optim, cfg.train
    return {"lr": o.lr, "schedule": o.schedule, "warmup_steps": o.warmup_steps, "decay_end": cfg.decay_end,
            "final_lr_ratio": o.final_lr_ratio, "weight_decay": o.weight_decay, "clip_norm": o.clip_norm,
            "batch_size": t.batch_size, "microbatch": t.microbatch}


def describe_config(cfg: Config) -> str:
    """The console's line for a config that passed its checks: what it resolved to, in one line."""
    r, layer = recipe(cfg), layer_of(cfg.mixer)
    decay = "" if r["schedule"] == "constant" else f" to step {r['decay_end']}"
    return (f"config checked: task {cfg.task.name}, mixer {cfg.mixer.name} as {layer.__qualname__}, width "
            f"{cfg.model.width} x depth {cfg.model.depth}; lr {r['lr']:g} (warmup {r['warmup_steps']}, "
            f"{r['schedule']}{decay}), weight decay {r['weight_decay']:g}, batch {r['batch_size']}, microbatch "
            f"{r['microbatch']}")


def hardware_of(mesh) -> dict:
    """The devices a run trains on: how many, their platform and kind (a GPU's model), over how many processes."""
    devices = list(mesh.devices.flat)
    return {"devices": len(devices), "platform": devices[0].platform, "kind": devices[0].device_kind,
            "processes": len({d.process_index for d in devices})}


def versions_of() -> dict:
    """The installed versions of tmem and what it trains with, the Python, and tmem's commit where it runs from a
    git checkout (None elsewhere), `dirty` when tracked files differ from it."""
    out = {"python": platform.python_version()}
    for key, name in DISTRIBUTIONS.items():
        try:
            out[key] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[key] = None
    return {**out, **_commit(Path(__file__).resolve().parents[2])}


def _commit(root: Path) -> dict:
    """{commit, dirty} of the git checkout at `root`, None each where there is none (or no git)."""
    def git(*args) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True,
                              timeout=10).stdout.strip()

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() == root:  # not a project tmem was installed into
            return {"commit": git("rev-parse", "HEAD"),
                    "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):  # no git, or no checkout
        pass
    return {"commit": None, "dirty": None}


def write_resolved(run_dir: Path, record: dict) -> None:
    """`<run>/resolved.yaml`, beside the run's `.hydra/config.yaml`."""
    write_atomically(Path(run_dir) / RESOLVED, yaml.safe_dump(record, sort_keys=False))
