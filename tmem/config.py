"""Typed schema of every config group, and validation before anything compiles.

Hydra composes YAML; `validate` turns the result into frozen dataclasses and
turns every problem into one `ConfigError` line naming the field and what is
allowed. Task and mixer schemas live beside their code (tasks.TASKS,
tmem.mixers.MIXERS) so adding one needs no edit here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tasks import TASKS
from tmem.layers import MLPS, NORMS
from tmem.mixers import MIXERS


class ConfigError(ValueError):
    """A bad config, described in one line."""


def task_target(name: str) -> float | None:
    """train.target's default: the named task's own (an unknown task is reported by validate)."""
    return getattr(TASKS.get(name), "default_target", None)


OmegaConf.register_new_resolver("tmem.task_target", task_target, replace=True)


def _choice(field: str, value: Any, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{field}={value!r} is not one of: {', '.join(map(str, allowed))}")


def _positive(**fields) -> None:
    for name, value in fields.items():
        if value is not None and value <= 0:
            raise ValueError(f"{name}={value} must be positive")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    width: int = 64
    depth: int = 2
    # auto (shortformer where the mixer has query and key inputs, else none), rope, learned (added to the
    # residual stream), none, shortformer (learned, added only to the query and key inputs of every mixer)
    positions: str = "auto"
    norm: str = "layernorm"
    tie_embeddings: bool = False
    embed_std: float = 1.0  # init scale of the token embedding
    train_embeddings: bool = True  # false: embedding and unembedding keep their random init (fixed codes)
    pos_std: float = 0.02  # init scale of the learned (or shortformer) position table
    # Vector tasks only. identity: tokens enter the residual stream as they are (width = the task's
    # token size) and the prediction is minus the last coordinate (von Oswald's y-slot);
    # learned: a linear read-in to the width and a linear read-out after the final norm;
    # auto: identity when the width is the token size, else learned.
    read_in: str = "auto"
    tie_blocks: bool = False  # vector tasks only: one block applied `depth` times (a looped model)

    def __post_init__(self):
        _positive(**{"model.width": self.width, "model.depth": self.depth})
        _choice("model.positions", self.positions, ("auto", "rope", "learned", "none", "shortformer"))
        _choice("model.norm", self.norm, NORMS)
        _choice("model.read_in", self.read_in, ("auto", "identity", "learned"))


@dataclasses.dataclass(frozen=True)
class MLPConfig:
    name: str = "none"
    expansion: float = 4.0  # hidden units per model width
    bias: bool = False

    def __post_init__(self):
        _choice("mlp.name", self.name, MLPS)
        _positive(**{"mlp.expansion": self.expansion})


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    name: str = "adamw"
    lr: float | None = None  # None: the mixer's recommended rate (mixer.lr); rows differ several-fold
    b1: float = 0.9
    b2: float = 0.98
    eps: float = 1e-8
    weight_decay: float = 0.0
    warmup_steps: int = 100
    schedule: str = "cosine"  # after warmup: cosine, linear (to final_lr_ratio * lr) or constant
    final_lr_ratio: float = 0.1
    clip_norm: float | None = 1.0

    def __post_init__(self):
        _choice("optim.name", self.name, ("adamw",))
        _choice("optim.schedule", self.schedule, ("cosine", "linear", "constant"))
        _positive(**{"optim.lr": self.lr, "optim.clip_norm": self.clip_norm})


@dataclasses.dataclass(frozen=True)
class LoggerConfig:
    mode: str = "offline"  # offline writes local files; `wandb sync <run dir>/wandb` uploads later
    project: str = "tmem"
    entity: str | None = None
    group: str | None = None
    tags: tuple[str, ...] = ()

    def __post_init__(self):
        _choice("logger.mode", self.mode, ("offline", "online", "disabled"))


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    steps: int = 5000
    batch_size: int = 64
    microbatch: int | None = None  # differentiate at most this many examples at once (same update)
    log_every: int = 50
    eval_every: int = 100
    checkpoint_every: int = 1000
    keep_checkpoints: int | None = 1  # None keeps every checkpoint (formation probes read them all)
    target: float | None = 0.99  # held-out value of the task's target metric to reach
    early_stop: bool = True  # stop at the first held-out eval that reaches target
    resume: bool = False  # continue from the run directory's latest checkpoint
    stop_after: int | None = None  # end this session (with a checkpoint) after this many steps

    def __post_init__(self):
        _positive(**{f"train.{f}": getattr(self, f) for f in
                     ("steps", "batch_size", "microbatch", "log_every", "eval_every", "checkpoint_every",
                      "keep_checkpoints", "stop_after")})
        if self.microbatch is not None and self.microbatch < self.batch_size and self.batch_size % self.microbatch:
            raise ValueError(f"train.microbatch={self.microbatch} must divide train.batch_size={self.batch_size}")


def position_scheme(cfg) -> str:
    """The position scheme a model actually uses.

    `auto` is shortformer where the mixer takes query and key inputs (on MQAR it
    trains faster than RoPE and costs less per step) and none elsewhere:
    recurrent mixers know order from their recurrence, and the in-context
    regression prompt of a vector task is a set of pairs.
    """
    if cfg.model.positions == "auto":
        tokens = cfg.task.input_kind == "tokens"
        return "shortformer" if tokens and getattr(cfg.mixer, "takes_qk_positions", False) else "none"
    return cfg.model.positions


def read_in_scheme(cfg) -> str:
    """How a vector task's tokens enter the model: `auto` becomes identity or learned by width."""
    if cfg.model.read_in == "auto":
        return "identity" if cfg.model.width == cfg.task.token_dim else "learned"
    return cfg.model.read_in


@dataclasses.dataclass(frozen=True)
class Config:
    task: Any
    mixer: Any
    model: ModelConfig
    mlp: MLPConfig
    optim: OptimConfig
    logger: LoggerConfig
    train: TrainConfig
    name: str | None = None


_FIXED = {"model": ModelConfig, "mlp": MLPConfig, "optim": OptimConfig, "logger": LoggerConfig,
          "train": TrainConfig}


def parse_group(section: str, schema: type, node: Any, drop: tuple[str, ...] = ()):
    """One group's YAML node -> its dataclass, or a one-line ConfigError."""
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{section}: expected a mapping of fields, got {node!r}")
    values = {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if k not in drop}
    allowed = ", ".join(f.name for f in dataclasses.fields(schema) if f.name not in drop)
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), values))
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or getattr(e, "key", None) or "?"
        first = str(e).splitlines()[0]
        if "not in" in first:
            raise ConfigError(f"{section}.{key}: unknown field; allowed: {allowed}") from None
        raise ConfigError(f"{section}.{key}: {first}") from None
    except (ValueError, TypeError) as e:
        message = str(e) if str(e).startswith(section) else f"{section}: {e}"
        raise ConfigError(message) from None


def _registered(section: str, node: Any, registry: dict):
    name = node.get("name") if isinstance(node, DictConfig) else None
    if name not in registry:
        raise ConfigError(f"{section}.name={name!r} is not one of: {', '.join(registry)}")
    return name


def validate(cfg: DictConfig) -> Config:
    """Check a composed config and return it typed; raises ConfigError."""
    for section in ("task", "mixer", *_FIXED):
        if section not in cfg:
            raise ConfigError(f"{section}: missing config group")
    task_name = _registered("task", cfg.task, TASKS)
    task = parse_group("task", TASKS[task_name], cfg.task, drop=("name",))
    mixer_schema, _ = MIXERS[_registered("mixer", cfg.mixer, MIXERS)]
    mixer = parse_group("mixer", mixer_schema, cfg.mixer)
    if getattr(mixer, "layout", None) == "auto":  # read the way the task's prompt allows
        mixer = dataclasses.replace(mixer, layout=getattr(task, "layout", "causal"))
    fixed = {section: parse_group(section, schema, cfg[section]) for section, schema in _FIXED.items()}
    if fixed["optim"].lr is None:
        if getattr(mixer, "lr", None) is None:
            raise ConfigError(f"optim.lr is null and mixer {mixer.name!r} recommends no rate; set optim.lr")
        fixed["optim"] = dataclasses.replace(fixed["optim"], lr=mixer.lr)
    config = Config(task=task, mixer=mixer, name=cfg.get("name"), **fixed)
    _check_together(config)
    return config


def _check_together(cfg: Config) -> None:
    """Constraints between groups."""
    try:
        cfg.mixer.check(cfg.model.width)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    vectors = cfg.task.input_kind == "vectors"
    if vectors and cfg.model.read_in == "identity" and cfg.model.width != cfg.task.token_dim:
        raise ConfigError(f"model.width={cfg.model.width} must equal the task's token size {cfg.task.token_dim} "
                          "with model.read_in=identity (or use model.read_in=learned)")
    if not vectors and cfg.model.tie_blocks:
        raise ConfigError("model.tie_blocks=true is implemented for vector tasks only")
    if getattr(cfg.mixer, "layout", "causal") == "prompt" and getattr(cfg.task, "layout", "causal") != "prompt":
        raise ConfigError(f"mixer.layout=prompt reads the whole prompt at once, but task {cfg.task.name!r} is "
                          "read causally; use mixer.layout=causal or auto")
    if cfg.model.positions == "rope" and not getattr(cfg.mixer, "applies_rope", False):
        raise ConfigError(f"model.positions=rope: mixer {cfg.mixer.name!r} does not apply RoPE; use learned or none")
    if cfg.model.positions == "shortformer" and not getattr(cfg.mixer, "takes_qk_positions", False):
        raise ConfigError(f"model.positions=shortformer: mixer {cfg.mixer.name!r} has no query and key inputs "
                          "to add positions to; use learned or none")


CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
GROUPS = ("task", "model", "mixer", "mlp", "optim", "logger", "experiment")


def check_group_overrides(overrides: list[str], config_dir: Path = CONFIG_DIR) -> str | None:
    """One line for a command-line `group=option` naming no file in configs/, else None.

    Hydra would report this too, over several lines; checking first gives the
    one-line message every other config error gets.
    """
    for arg in overrides:
        key, eq, value = arg.lstrip("+~").partition("=")
        if not eq or key not in GROUPS or value in ("null", ""):
            continue
        options = sorted(p.stem for p in (config_dir / key).glob("*.yaml"))
        for option in value.split(","):
            if option not in options:
                return f"{key}={option}: no such option; allowed: {', '.join(options)}"
    return None
