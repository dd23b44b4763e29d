"""A composed config made typed, checked before anything compiles, and the Hydra nodes the YAML files extend.

Hydra composes YAML; `validate` turns the result into the frozen dataclasses
of tmem.schema (and tasks.TASKS, tmem.mixers.CONFIGS, beside their code, so
adding a task or a row needs no edit here), fills in what a row recommends,
and turns every problem into one `ConfigError` line naming the field and
what is allowed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tasks import TASKS
from tasks.examples import MAX_POSITION
from tmem.mixers import CONFIGS, MixerConfig
from tmem.schema import ClusterConfig, Config, LoggerConfig, MLPConfig, ModelConfig, OptimConfig, TrainConfig


INT32_MAX = 2**31 - 1


class ConfigError(ValueError):
    """A bad config, described in one line."""


def task_target(name: str) -> float | None:
    """train.target's default: the named task's own (an unknown task is reported by validate)."""
    return getattr(TASKS.get(name), "default_target", None)


OmegaConf.register_new_resolver("tmem.task_target", task_target, replace=True)


def resolve_auto(model: ModelConfig, mixer: MixerConfig, task) -> ModelConfig:
    """The model's "auto" settings made concrete, once, so no module guesses them later.

    Positions: shortformer where the mixer takes query and key inputs (on MQAR
    it trains faster than RoPE and costs less per step), none elsewhere:
    recurrent mixers know order from their recurrence, and the in-context
    regression prompt of a vector task is a set of pairs. Read-in (vector
    tasks): identity when the width is the token size, else learned.
    """
    vectors = task.input_kind == "vectors"
    if model.positions == "auto":
        qk = not vectors and mixer.takes_qk_positions
        model = dataclasses.replace(model, positions="shortformer" if qk else "none")
    if vectors and model.read_in == "auto":
        model = dataclasses.replace(model, read_in="identity" if model.width == task.token_dim else "learned")
    return model


_FIXED = {"model": ModelConfig, "mlp": MLPConfig, "optim": OptimConfig, "logger": LoggerConfig,
          "train": TrainConfig}


def parse_group(section: str, schema: type, node: Any, drop: tuple[str, ...] = ()):
    """One group's YAML node -> its dataclass, or a one-line ConfigError."""
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{section}: expected a mapping of fields, got {node!r}")
    values = {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if k not in drop}
    allowed = ", ".join(f.name for f in dataclasses.fields(schema) if f.name not in drop)
    try:
        parsed = OmegaConf.to_object(OmegaConf.merge(_writable(OmegaConf.structured(schema)), values))
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or getattr(e, "key", None) or "?"
        first = str(e).splitlines()[0]
        if "not in" in first:
            raise ConfigError(f"{section}.{key}: unknown field; allowed: {allowed}") from None
        raise ConfigError(f"{section}.{key}: {first}") from None
    except (ValueError, TypeError) as e:
        message = str(e) if str(e).startswith(section) else f"{section}: {e}"
        raise ConfigError(message) from None
    _int32(section, parsed)
    # OmegaConf gives a tuple field a list; a config must hash (jit takes a model's structure, which holds its
    # mixer's config, as static)
    lists = {f.name: tuple(getattr(parsed, f.name)) for f in dataclasses.fields(parsed)
             if str(f.type).startswith("tuple") and isinstance(getattr(parsed, f.name), list)}
    return dataclasses.replace(parsed, **lists) if lists else parsed


def _int32(section: str, parsed) -> None:
    """Every integer of a group (a nested dataclass's too) in int32's range: tmem keeps counts, sizes, steps and
    seeds in int32 on the device, where a larger one fails inside a jitted program (or wraps around silently)."""
    for f in dataclasses.fields(parsed):
        value = getattr(parsed, f.name)
        if dataclasses.is_dataclass(value):
            _int32(f"{section}.{f.name}", value)
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT32_MAX:
            raise ConfigError(f"{section}.{f.name}={value} must be at most {INT32_MAX} in size: tmem keeps "
                              "counts, sizes, steps and seeds in int32")


def _writable(node: DictConfig) -> DictConfig:
    """A frozen dataclass's node with its read-only flag cleared on it and on every nested dataclass's node (each
    carries its own, mixer.optim's too), so that values merge into it; the dataclass made from it stays frozen."""
    OmegaConf.set_readonly(node, False)
    for child in node.values():
        if isinstance(child, DictConfig):
            _writable(child)
    return node


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
    mixer = parse_group("mixer", CONFIGS[_registered("mixer", cfg.mixer, CONFIGS)], cfg.mixer)
    fixed = {section: parse_group(section, schema, cfg[section]) for section, schema in _FIXED.items()}
    try:
        mixer = mixer.fit(task, fixed["model"].width)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    fixed["optim"] = _recommended(fixed["optim"], mixer)
    if fixed["train"].microbatch == "auto":
        try:
            fixed["train"] = dataclasses.replace(fixed["train"], microbatch=mixer.microbatch)
        except ValueError as e:
            raise ConfigError(f"{e} (train.microbatch=auto takes mixer.microbatch; set train.microbatch)") from None
    cluster = parse_group("cluster", ClusterConfig, cfg.cluster) if "cluster" in cfg else ClusterConfig()
    config = Config(task=task, mixer=mixer, name=cfg.get("name"), cluster=cluster, **fixed)
    _check_together(config)
    return dataclasses.replace(config, model=resolve_auto(config.model, mixer, task))


def _recommended(optim: OptimConfig, mixer: MixerConfig) -> OptimConfig:
    """The optim group with what it leaves null taken from the mixer's recommendations (mixer.lr, mixer.optim)."""
    if optim.lr is None and mixer.lr is None:
        raise ConfigError(f"optim.lr is null and mixer {mixer.name!r} recommends no rate; set optim.lr")
    weight_decay = optim.weight_decay if optim.weight_decay is not None else mixer.optim.weight_decay
    try:
        return dataclasses.replace(optim, lr=optim.lr or mixer.lr, weight_decay=weight_decay or 0.0,
                                   decay_steps=optim.decay_steps or mixer.optim.decay_steps)
    except ValueError as e:
        recipe = ", ".join(f"mixer.{k}={v}" for k, v in (*((f"optim.{k}", v) for k, v in
                                                            dataclasses.asdict(mixer.optim).items()), ("lr", mixer.lr))
                           if v is not None)
        raise ConfigError(f"{e}; mixer={mixer.name} recommends {recipe}: set optim.* to train otherwise") from None


def _check_together(cfg: Config) -> None:
    """Constraints between groups."""
    try:
        cfg.mixer.check(cfg.model.width)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    examples = getattr(cfg.task, "train_examples", None)
    if examples is not None and examples < 1:
        raise ConfigError(f"task.train_examples={examples} must be at least 1 (or null: fresh examples every step)")
    positions = cfg.train.steps * cfg.train.batch_size
    if examples is not None and positions > MAX_POSITION + 1:
        raise ConfigError(f"task.train_examples: train.steps={cfg.train.steps} x train.batch_size="
                          f"{cfg.train.batch_size} reads {positions} stream positions of the fixed set, more than "
                          f"its int32 cursor counts ({MAX_POSITION + 1}): lower train.steps")
    vectors = cfg.task.input_kind == "vectors"
    if vectors and cfg.model.read_in == "identity" and cfg.model.width != cfg.task.token_dim:
        raise ConfigError(f"model.width={cfg.model.width} must equal the task's token size {cfg.task.token_dim} "
                          "with model.read_in=identity (or use model.read_in=learned)")
    if cfg.model.positions == "rope" and not cfg.mixer.applies_rope:
        raise ConfigError(f"model.positions=rope: mixer {cfg.mixer.name!r} does not apply RoPE; use learned or none")
    if cfg.model.positions == "shortformer" and not cfg.mixer.takes_qk_positions:
        raise ConfigError(f"model.positions=shortformer: mixer {cfg.mixer.name!r} has no query and key inputs "
                          "to add positions to; use learned or none")
    uneven = isinstance(cfg.cluster.cpu_devices, int) and cfg.train.uneven(cfg.cluster.cpu_devices)
    if uneven:
        raise ConfigError(f"cluster.cpu_devices={cfg.cluster.cpu_devices}: {uneven}; give another count, or "
                          "cluster.cpu_devices=auto")


def register_bases() -> None:
    """Each group's defaults, written once in its dataclass, as the Hydra config its YAML files extend.

    The nodes are stored untyped (plain dicts): a typed structured config would
    have Hydra reject a bad value in its own multi-line error before `validate`
    can name it in one line. Row YAMLs say `defaults: [base_<schema>, _self_]`
    and hold only what differs, so a composed config (the run's
    .hydra/config.yaml and its wandb config) still lists every field, and any
    field can be overridden without `++`.
    """
    store = ConfigStore.instance()

    def node(schema, **values):
        return {**{k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(schema()).items()},
                **values}

    for row in set(CONFIGS.values()):
        store.store(group="mixer", name=f"base_{row.__module__.rsplit('.', 1)[-1]}", node=node(row))
    for name, schema in TASKS.items():
        store.store(group="task", name=f"base_{name}", node={"name": name, **node(schema)})
    for group in ("model", "mlp", "optim", "logger"):
        store.store(group=group, name="base", node=node(_FIXED[group]))
    store.store(group="cluster", name="base", node=node(ClusterConfig))
    store.store(name="base_train", node={"train": node(TrainConfig)})
    # eval.yaml's task overrides: their fields are the run's task's, known only once the run is read, so the
    # node takes any key (without the struct flag Hydra puts on the rest) and tmem.train.task_overrides checks
    # them; a YAML file cannot clear the flag, hence a stored node. Evaluations keep their compiled programs
    # where training does, by default
    evaluation = OmegaConf.create({"task": {}, "compilation_cache": ClusterConfig().compilation_cache})
    OmegaConf.set_struct(evaluation.task, False)
    store.store(name="base_eval", node=evaluation)


register_bases()

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
GROUPS = ("task", "model", "mixer", "mlp", "optim", "logger", "cluster", "experiment")
