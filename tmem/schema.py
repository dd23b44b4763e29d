"""The typed schema of a run's config: each fixed group's frozen dataclass with its one-line checks, and Config.

Each dataclass holds its group's defaults (tmem.config stores them as the
Hydra nodes the YAML files extend) and checks its own fields in
`__post_init__`, raising a ValueError that names the field; tmem.config's
`validate` turns a composed YAML into these and reports every problem as one
ConfigError line. Task, mixer and MLP schemas live beside their code (tasks.TASKS,
tmem.mixers.CONFIGS, tmem.mlps.CONFIGS).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tmem.layers import NORMS
from tmem.mixers import MixerConfig
from tmem.mlps import MLPConfig


def cycled(pattern: tuple, n: int) -> tuple:
    """The first n entries of `pattern` repeated: layer i of a hybrid stack is entry i mod the pattern's length."""
    return tuple(pattern[i % len(pattern)] for i in range(n))


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
    # with tie_blocks, one block applied `depth` times (a looped model), each application with its own state; in a
    # hybrid, one block per entry of model.mixers, the pattern looped
    tie_blocks: bool = False
    # a hybrid stack: each layer's mixer, the list cycled over the depth (Zoology's Hybrid); each entry a row's name
    # or a row with its own knobs ({name: softmax, window: 8}), composed from configs/mixer/<name>.yaml; validation
    # makes them the rows' configs. Empty: every layer is the mixer group's
    mixers: tuple[Any, ...] = ()

    def __post_init__(self):
        _positive(**{"model.width": self.width, "model.depth": self.depth})
        _choice("model.positions", self.positions, ("auto", "rope", "learned", "none", "shortformer"))
        _choice("model.norm", self.norm, NORMS)
        _choice("model.norm_position", self.norm_position, ("pre", "post"))
        _choice("model.read_in", self.read_in, ("auto", "identity", "learned"))

    def layer_mixers(self, mixer: MixerConfig) -> tuple[MixerConfig, ...]:
        """Each block's mixer config: model.mixers cycled over the blocks, else `mixer` in every one. One block per
        application, or with tie_blocks one per entry of the pattern (which the applications then cycle over)."""
        pattern = self.mixers or (mixer,)
        return cycled(pattern, len(pattern) if self.tie_blocks else self.depth)


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    name: str = "adamw"
    lr: float | None = None  # None: the mixer's recommended rate (mixer.recipe.lr); rows differ several-fold
    b1: float = 0.9
    b2: float = 0.98
    eps: float = 1e-8
    weight_decay: float | None = None  # null: the mixer's recommendation (mixer.recipe.weight_decay), else 0
    warmup_steps: int = 100
    schedule: str = "cosine"  # after warmup: cosine, linear (to final_lr_ratio * lr) or constant
    final_lr_ratio: float = 0.1
    # the step the decay ends at, warmup included; the rate then stays at final_lr_ratio * lr. null: the mixer's
    # recommendation (mixer.recipe.decay_steps), else train.steps. train.steps is also the cap of a run that stops
    # at its target, so raising the cap stretches a decay tied to it; a resume may not (tmem.train.rundir: it names
    # decay_steps, which keeps the run's schedule)
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
        port = None if self.coordinator is None else self.coordinator.rpartition(":")[2]
        if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"cluster.coordinator={self.coordinator!r} must be host:port, a port from 1 to 65535")


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
    # CPU; auto: the mixer's (mixer.recipe.microbatch, resolved by validation), null: each device its whole part
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


@dataclasses.dataclass(frozen=True)
class Config:
    """A run's whole config, typed: what tmem.config.validate returns and every module reads."""

    task: Any  # a task's dataclass (tasks.TASKS)
    mixer: MixerConfig
    model: ModelConfig
    mlp: MLPConfig  # one of tmem.mlps.CONFIGS
    optim: OptimConfig
    logger: LoggerConfig
    train: TrainConfig
    name: str | None = None
    cluster: ClusterConfig = dataclasses.field(default_factory=ClusterConfig)  # absent from runs made before it

    @property
    def layers(self) -> tuple[MixerConfig, ...]:
        """Each block application's mixer config (`depth` of them): the hybrid's pattern cycled, or `mixer`."""
        return cycled(self.model.mixers or (self.mixer,), self.model.depth)

    @property
    def decay_end(self) -> int:
        """The step the learning-rate decay ends at: optim.decay_steps (where validation puts the mixer's
        recommendation), else train.steps; never before the warmup is over, since the schedule decays over at
        least one step after it (tmem.train.optim). So a run shorter than its warmup has the end a resume can
        name: optim.decay_steps must be more than optim.warmup_steps."""
        return max(self.optim.decay_steps or self.train.steps, self.optim.warmup_steps + 1)
