"""Typed schema of every config group, and validation before anything compiles.

Hydra composes YAML; `validate` turns the result into frozen dataclasses and
turns every problem into one `ConfigError` line naming the field and what is
allowed. Task and mixer schemas live beside their code (tasks.TASKS,
tmem.mixers.CONFIGS) so adding one needs no edit here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tasks import TASKS
from tmem.layers import MLPS, NORMS
from tmem.mixers import CONFIGS, MixerConfig


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


def _non_negative(**fields) -> None:
    for name, value in fields.items():
        if value is not None and value < 0:
            raise ValueError(f"{name}={value} must be zero or more")


def _fraction(**fields) -> None:
    """Values in [0, 1): Adam's moment decays (1 would never forget the first gradient)."""
    for name, value in fields.items():
        if not 0 <= value < 1:
            raise ValueError(f"{name}={value} must be in [0, 1)")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    width: int = 64
    depth: int = 2
    # auto (shortformer where the mixer has query and key inputs, else none; resolved by validation), rope,
    # learned (added to the residual stream), none, shortformer (learned, added only to every mixer's q and k inputs)
    positions: str = "auto"
    norm: str = "layernorm"
    # pre: x += mixer(norm x), x += mlp(norm x); post (the original Transformer's): x = norm(x + mixer(x)),
    # x = norm(x + mlp(x)), and no final norm before the head (the last block's output is already normed)
    norm_position: str = "pre"
    tie_embeddings: bool = False  # untied: recall forms several times faster than with a tied unembedding
    embed_std: float = 1.0  # init scale of the token embedding
    train_embeddings: bool = True  # false: embedding and unembedding keep their random init (fixed codes)
    pos_std: float = 0.02  # init scale of the learned (or shortformer) position table
    # Vector tasks only. identity: tokens enter the residual stream as they are (width = the task's
    # token size) and the prediction is minus the last coordinate (von Oswald's y-slot);
    # learned: a linear read-in to the width and a linear read-out after the final norm;
    # auto: identity when the width is the token size, else learned (resolved by validation).
    read_in: str = "auto"
    tie_blocks: bool = False  # one block applied `depth` times (a looped model), each application with its own state

    def __post_init__(self):
        _positive(**{"model.width": self.width, "model.depth": self.depth})
        _choice("model.positions", self.positions, ("auto", "rope", "learned", "none", "shortformer"))
        _choice("model.norm", self.norm, NORMS)
        _choice("model.norm_position", self.norm_position, ("pre", "post"))
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
    weight_decay: float | None = None  # null: the mixer's recommendation (mixer.optim.weight_decay), else 0
    warmup_steps: int = 100
    schedule: str = "cosine"  # after warmup: cosine, linear (to final_lr_ratio * lr) or constant
    final_lr_ratio: float = 0.1
    # the step the decay ends at, warmup included; the rate then stays at final_lr_ratio * lr. null: the mixer's
    # recommendation (mixer.optim.decay_steps), else train.steps. train.steps is also the cap of a run that stops
    # at its target, so raising the cap (or resuming a run with a higher one) stretches a decay tied to it; a run
    # with decay_steps set keeps its schedule
    decay_steps: int | None = None
    clip_norm: float | None = 1.0

    def __post_init__(self):
        _choice("optim.name", self.name, ("adamw",))
        _choice("optim.schedule", self.schedule, ("cosine", "linear", "constant"))
        _positive(**{"optim.lr": self.lr, "optim.clip_norm": self.clip_norm, "optim.eps": self.eps,
                     "optim.decay_steps": self.decay_steps})
        _fraction(**{"optim.b1": self.b1, "optim.b2": self.b2})
        _non_negative(**{"optim.weight_decay": self.weight_decay, "optim.warmup_steps": self.warmup_steps,
                         "optim.final_lr_ratio": self.final_lr_ratio})
        if self.decay_steps is not None and self.decay_steps <= self.warmup_steps:
            raise ValueError(f"optim.decay_steps={self.decay_steps} must be more than optim.warmup_steps="
                             f"{self.warmup_steps}: the decay ends after the warmup")


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
class ClusterConfig:
    """How many processes (hosts) train one run; see tmem/train/cluster.py.

    Not part of the run itself: a resume may change it (checkpoints restore
    under any device layout).
    """

    # call jax.distributed.initialize before JAX starts; the fields below left null are found from the
    # environment as JAX's own cluster detection finds them (SLURM, Open MPI, Cloud TPU)
    initialize: bool = False
    coordinator: str | None = None  # host:port where process 0 serves the other processes' rendezvous
    processes: int | None = None  # how many processes train the run
    process_id: int | None = None  # this process's rank, 0 to processes - 1
    timeout: int = 300  # seconds to wait for every process to join
    # devices a CPU shows JAX when it is the platform: auto, one per core this process may use (as many as split
    # the batch into shares of 8 or more per device, TrainConfig.split), so each core differentiates its share on
    # its own, which on 2 cores makes the default job's step 18-34% faster than one device over both
    # (BENCHMARKS.md, "One all-reduce a step"); a number; or 1, JAX's own. JAX_NUM_CPU_DEVICES or XLA_FLAGS'
    # --xla_force_host_platform_device_count, when set, win. A run on several processes keeps JAX's one CPU
    # device each unless given a number.
    cpu_devices: int | str = "auto"
    # where compiled programs persist between runs (JAX's persistent compilation cache), so the runs of a sweep
    # that share programs compile them once: a repeated run of Gated DeltaNet's default job takes 20 s, not 30
    # (BENCHMARKS.md); null for none. JAX_COMPILATION_CACHE_DIR, when set, wins
    compilation_cache: str | None = "~/.cache/tmem/jax"

    def __post_init__(self):
        if isinstance(self.cpu_devices, str) and self.cpu_devices != "auto":
            raise ValueError(f"cluster.cpu_devices={self.cpu_devices!r} must be a positive integer or auto")
        _positive(**{"cluster.processes": self.processes, "cluster.timeout": self.timeout},
                  **({} if isinstance(self.cpu_devices, str) else {"cluster.cpu_devices": self.cpu_devices}))
        if self.process_id is not None and not 0 <= self.process_id < (self.processes or self.process_id + 1):
            raise ValueError(f"cluster.process_id={self.process_id} must be in 0..cluster.processes-1"
                             f" ({self.processes} processes)")
        if self.coordinator is not None and ":" not in self.coordinator:
            raise ValueError(f"cluster.coordinator={self.coordinator!r} must be host:port")


def split_batch(batch_size: int, microbatch: int | None, devices: int) -> tuple[int, int]:
    """(slices, share): a step on `devices` devices differentiates its batch in `slices` slices, one after
    another, each device `share` examples of each at once: the microbatch, or the device's part of the batch
    where that is smaller. So a microbatch is the same work per device on any number of devices. Whether the
    shares fill the batch exactly is `TrainConfig.uneven`'s question."""
    part = max(batch_size // devices, 1)
    share = microbatch if microbatch is not None and microbatch < part else part
    return max(part // share, 1), share


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    steps: int = 5000
    batch_size: int = 64
    # each device differentiates at most this many examples at once (`split`): the same update, faster on a
    # CPU; auto: the mixer's (mixer.microbatch, resolved by validation), null: each device its whole part
    microbatch: int | str | None = "auto"
    log_every: int = 50
    eval_every: int = 50
    checkpoint_every: int = 1000
    keep_checkpoints: int | None = 1  # None keeps every checkpoint (formation probes read them all)
    target: float | None = 0.99  # held-out value of the task's target metric to reach
    early_stop: bool = True  # stop at the first held-out eval that reaches target
    resume: bool = False  # continue from the run directory's latest checkpoint
    stop_after: int | None = None  # end this session (with a checkpoint) after this many steps
    # stop as diverged when the held-out loss is above diverge_factor times the larger of chance (the loss of
    # all-zero outputs) and the untrained model's at diverge_patience evaluations in a row: a finite loss can
    # diverge too; null turns it off
    diverge_factor: float | None = 10.0
    diverge_patience: int = 3
    # the dtype of activations and matmuls: bfloat16 casts the parameters for each forward pass (their gradients
    # flow back to the float32 copies, which the optimizer updates, as its state stays float32) and the loss
    # reads float32 logits; the fast-weight memories keep their own math in float32 either way
    compute_dtype: str = "float32"

    def __post_init__(self):
        if isinstance(self.microbatch, str) and self.microbatch != "auto":
            raise ValueError(f"train.microbatch={self.microbatch!r} must be a positive integer, null or auto")
        _positive(**{f"train.{f}": getattr(self, f) for f in
                     ("steps", "batch_size", "log_every", "eval_every", "checkpoint_every",
                      "keep_checkpoints", "stop_after", "diverge_factor", "diverge_patience")},
                  **({} if isinstance(self.microbatch, str) else {"train.microbatch": self.microbatch}))
        if isinstance(self.microbatch, int) and self.microbatch < self.batch_size and self.batch_size % self.microbatch:
            raise ValueError(f"train.microbatch={self.microbatch} must divide train.batch_size={self.batch_size}")
        _choice("train.compute_dtype", self.compute_dtype, ("float32", "bfloat16"))

    def split(self, devices: int) -> tuple[int, int]:
        """(slices, share) of this batch and microbatch on `devices` devices (`split_batch`)."""
        return split_batch(self.batch_size, self.microbatch if isinstance(self.microbatch, int) else None, devices)

    def uneven(self, devices: int) -> str | None:
        """Why the batch cannot be split into equal shares over `devices` devices, in a few words, else None."""
        if self.batch_size % devices:
            return f"train.batch_size={self.batch_size} does not split evenly over {devices} devices"
        slices, share = self.split(devices)
        if slices * share * devices != self.batch_size:
            return (f"train.microbatch={self.microbatch} does not divide the {self.batch_size // devices} examples "
                    f"each of {devices} devices gets of train.batch_size={self.batch_size}")
        return None


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


@dataclasses.dataclass(frozen=True)
class Config:
    task: Any  # a task's dataclass (tasks.TASKS)
    mixer: MixerConfig
    model: ModelConfig
    mlp: MLPConfig
    optim: OptimConfig
    logger: LoggerConfig
    train: TrainConfig
    name: str | None = None
    cluster: ClusterConfig = dataclasses.field(default_factory=ClusterConfig)  # absent from runs made before it


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
    # OmegaConf gives a tuple field a list; a config must hash (jit takes a model's structure, which holds its
    # mixer's config, as static)
    lists = {f.name: tuple(getattr(parsed, f.name)) for f in dataclasses.fields(parsed)
             if str(f.type).startswith("tuple") and isinstance(getattr(parsed, f.name), list)}
    return dataclasses.replace(parsed, **lists) if lists else parsed


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
        recipe = ", ".join(f"mixer.optim.{k}={v}" for k, v in dataclasses.asdict(mixer.optim).items() if v is not None)
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
    # them; a YAML file cannot clear the flag, hence a stored node
    evaluation = OmegaConf.create({"task": {}})
    OmegaConf.set_struct(evaluation.task, False)
    store.store(name="base_eval", node=evaluation)


register_bases()

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
GROUPS = ("task", "model", "mixer", "mlp", "optim", "logger", "cluster", "experiment")
