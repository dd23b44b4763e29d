"""The mixer protocol: every row of the unified table is a memory with a state, a write and a read.

A row is a config (a `MixerConfig` with the row's knobs) and a layer (a `Mixer`)
that every block calls the same way,

    y, state = mixer(x, state=None, head_mask=None, read_at=None, qk_positions=None)

writing every token of x [B, T, D] into the state and reading it with the
queries. The state it returns (a `MixerState`) continues a later call and knows
how many tokens it has read, so positions continue without guessing a length
from a cache's shape.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from collections import Counter
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import nnx, struct

# with the protocol: a row, in tmem or outside it (tests/my_memory), reads at positions with it
from tmem.memory.reads import at_positions  # noqa: F401
from tmem.mixers.flops import Uncounted


Cell = tuple[str, str, str, str]  # a grid cell: (weights, function, optimizer, initial), tmem/mixers/regression.py
# the grid's weights gamma as the forget knob of a memory that forgets as a whole (mesa's, Titans')
FORGET_OF_WEIGHTS = {"uniform": "none", "decay": "fixed", "gate": "gate"}


def resumable(default):
    """A config field a resume may change (tmem.train.rundir.check_resume): how the run is computed (the same
    function), not what it computes."""
    return dataclasses.field(default=default, metadata={"resumable": True})


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How a row trains best, apart from what it is (`mixer.recipe.*`): used where the optim and train groups leave
    a setting null or auto, so sweeping a memory's knobs never changes how it is trained. Null: the group's own
    default."""

    lr: float | None = 1e-2  # the learning rate this row trains best at (used when optim.lr is null)
    decay_steps: int | None = None  # the step the rate's decay ends at (null: train.steps)
    weight_decay: float | None = None  # AdamW's (null: 0)
    # the step cap of this row's job where the command or an experiment leaves train.steps to the row (null:
    # TrainConfig's 5,000): for a row whose seeds need longer on the default job (train.yaml's interpolation).
    # Resumable, as train.steps is: the cap, not the schedule (decay_steps)
    steps: int | None = resumable(None)
    # the examples each device of this row's train step differentiates at once fastest on the default job, on
    # a 2-core CPU, one device per core (null: each device its whole part of the batch), used when
    # train.microbatch is auto. The same update at any size: only the speed differs, through how much of a
    # slice's activations stays in cache (benchmarks/microbatch.py, BENCHMARKS.md): 8 for every row measured,
    # 1.1 times faster than 32 for softmax, 1.5 to 1.8 for the rows that train or solve in the forward pass.
    # An accelerator wants whole parts (train.microbatch=null). Resumable: runs saved before
    # train.microbatch=auto hold a number where a new command has auto
    microbatch: int | None = resumable(8)

    def __post_init__(self):
        steps = self.steps
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0):
            raise ValueError(f"mixer.recipe.steps={steps} must be a positive number of steps, or null (the job's "
                             "train.steps)")


@dataclasses.dataclass(frozen=True)
class Run:
    """How a row's layer computes its function (`mixer.run.*`: its form, its chunk), apart from the function: a
    row with several forms extends it, and every form is tested against the definition, so a resume may change
    any of it (the field is `resumable`). This base has no fields: a row with one form."""


def recommended(**values) -> dataclasses.Field:
    """A row's `recipe` field with its own recommendations (`recipe: Recipe = recommended(lr=3e-3)`)."""
    return dataclasses.field(default_factory=lambda: Recipe(**values))


def run_field(kind: type[Run]) -> dataclasses.Field:
    """A row's `run` field of its own kind (`run: FastWeightRun = run_field(FastWeightRun)`), marked resumable."""
    return dataclasses.field(default_factory=kind, metadata={"resumable": True})


def resumable_fields(schema: type) -> tuple[str, ...]:
    """The dotted names of the fields a resume may change in a config of type `schema` (and in its recipe); a
    name ending in "." is a whole part (`run.`)."""
    names = []
    for f in dataclasses.fields(schema):
        if f.metadata.get("resumable"):
            names.append(f.name + ("." if f.default_factory is not dataclasses.MISSING else ""))
        elif f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(part := f.default_factory()):
            names += [f"{f.name}.{name}" for name in resumable_fields(type(part))]
    return tuple(names)


@dataclasses.dataclass(frozen=True)
class MixerConfig(abc.ABC):
    """The fields and capabilities every row's config has; each row extends it with its knobs, and its recipe
    and run with its own defaults.

    Abstract: a row's config that does not say how large its state is cannot be made.
    """

    name: str = ""
    recipe: Recipe = dataclasses.field(default_factory=Recipe)  # how it trains best (mixer.recipe.*)
    run: Run = run_field(Run)  # how it computes (mixer.run.*)

    applies_rope: ClassVar[bool] = False  # model.positions=rope rotates this mixer's q and k
    takes_qk_positions: ClassVar[bool] = False  # model.positions=shortformer adds positions to its q and k inputs
    # its layer has no form without RoPE (MLA's decoupled rotary key): model.positions=auto resolves to rope, and
    # validation refuses any other
    needs_rope: ClassVar[bool] = False
    mixes: ClassVar[bool] = True  # False: the layer reads no other token and adds nothing (no norm, no add counted)
    # its layer sows `attention`, each head's causal softmax weights over the tokens [B, H, T, T], the patterns the
    # induction probe scores
    attention_patterns: ClassVar[bool] = False

    def with_run(self, **changes) -> MixerConfig:
        """This config computed another way: its run part with `changes` (a form, a chunk)."""
        return dataclasses.replace(self, run=dataclasses.replace(self.run, **changes))

    def check(self, width: int) -> None:
        """Raise ValueError, in one line naming the field, for a knob that does not fit a model of this width."""

    def fit(self, task, width: int) -> MixerConfig:
        """This config as it reads `task` in a model of this `width`: its "auto" knobs resolved; ValueError if it
        cannot read the task."""
        return self

    def for_evaluation(self) -> MixerConfig:
        """The config the held-out evaluation builds this row's layer from: the same parameters, maybe another
        form of the same function, one that is faster without a backward."""
        return self

    @abc.abstractmethod
    def state_size(self, width: int, seq_len: int) -> int:
        """Elements of the state after `seq_len` tokens, per example and layer."""

    def state_size_per_token(self, width: int) -> int | None:
        """How much the state grows per token; None for a fixed-size state."""
        return None

    def cell(self) -> Cell | None:
        """The cell of the test-time-regression grid (tmem/mixers/regression.py) this config computes, None for
        none: a row's YAML whose config has a cell is that cell's named row."""
        return None

    def at_cell(self, cell: Cell, mini_batch: int, heads: int, write_strength: str | None = None
                ) -> MixerConfig | None:
        """This config with its knobs set to compute `cell` at the grid's `heads` (and its `mini_batch`, for the
        minibatch and momentum optimisers), with a learned per-token write strength or none (`write_strength`
        learned | none; None: the row's own), or None where this row's layer cannot."""
        return None

    def flops(self, model, B: int, T: int, Q: int | None, input_grad: bool, once: bool = False) -> Counter:
        """This layer's FLOPs in a training step of B examples of T tokens, forward and backward, by part
        (tmem.mixers.flops): in a model of this config (tmem.schema.ModelConfig: its width and positions), reading
        at Q positions per example (None: all), its input needing a gradient or not, each loop's body counted once
        (`once`, as XLA's cost analysis does) or every time. A form or row without a count raises Uncounted."""
        raise Uncounted(f"mixer {self.name!r} has no FLOP count: give {type(self).__name__} a `flops` method "
                        "(tmem.mixers.base.MixerConfig.flops)")


@struct.dataclass
class MixerState:
    """What a call hands the next: the memory (in subclasses) and how many tokens were read.

    `length` is a count kept by the mixer, not an array: it decides positions
    (RoPE, learned tables) when a call continues, and a jitted call specialises on it.
    """

    length: int = struct.field(pytree_node=False, default=0, kw_only=True)

    def matrix(self, layer: Mixer) -> jax.Array:
        """The memory as one matrix per example and head [B, H, d_k, d_v], key-major (read as q S), for the state
        probes (tmem.probes.memory_state), given the layer that wrote it; NoMatrix, naming what the state is
        instead, where it is none."""
        raise NoMatrix("no sequence memory" if type(self) is MixerState else type(self).__name__)

    def read_matrix(self, layer: Mixer) -> jax.Array:
        """The matrix the read applies to a query [B, H, d_k, d_v] (o = q S): `matrix`, except for a memory that
        transforms its query first (mesa's solve), for the least-squares probe."""
        return self.matrix(layer)

    def with_matrix(self, layer: Mixer, matrix: jax.Array) -> MixerState:
        """The state with its matrix replaced (key-major [B, H, d_k, d_v]), to read another memory through the
        trained model (tmem.probes.least_squares); NoMatrix where the read is no matrix it could replace."""
        raise NoMatrix(f"{type(self).__name__} has no matrix to replace")


class NoMatrix(ValueError):
    """A state that is no matrix (a cache, an MLP's weights, nothing): its message says what it is instead."""


class Mixer(nnx.Module):
    """A row as a layer. Built as `Row.layer(config, width, rope=..., rngs=...)`; called as below.

    Abstract (nnx modules are ABCs): a layer without `__call__` cannot be built.
    """

    # the intermediates it sows under nnx.capture (a no-op otherwise), which probes read: `state` (the final
    # memory), `keys` (the keys it wrote, [B, T, H, d_k], what enters the state), `queries` (what reads it, the
    # same shape), `writes` (what else each token writes: its values [B, T, H, d_v], log decay [B, T, H, 1 or
    # d_k] and write strength [B, T, H]), `attention` (each head's weights)
    sows: ClassVar[frozenset[str]] = frozenset()

    @abc.abstractmethod
    def __call__(self, x_btd: jax.Array, *, state: MixerState | None = None, head_mask: jax.Array | None = None,
                 read_at: jax.Array | None = None, qk_positions: jax.Array | None = None
                 ) -> tuple[jax.Array, MixerState]:
        """Read-out [B, T, D], or [B, Q, D] at read_at [B, Q], and the state after the last token.

        Every token is written whatever read_at says: reading at a few positions
        skips the other queries, which is all a last layer needs when the loss
        looks at a few positions. head_mask [heads] multiplies each head's read
        (0 ablates it). qk_positions [1, T, D] (shortformer) is added to the
        inputs of the query and key maps only; validation gives it only to rows
        that declare takes_qk_positions, and the others receive None.
        """


def check_knobs(config: MixerConfig, *, choices: dict[str, tuple] | None = None, positive: tuple[str, ...] = (),
                width: int | None = None) -> None:
    """The checks every row's config makes, each a one-line ValueError naming the field: a knob that is not one
    of its choices, a count that is not positive (None is allowed: a count left to a default), heads that do
    not divide the width, and a short convolution's kernel. A field of the row's run or recipe by its dotted
    name (`run.chunk`)."""
    for field, allowed in (choices or {}).items():
        if knob(config, field) not in allowed:
            raise ValueError(f"mixer.{field}={knob(config, field)!r} is not one of: {', '.join(allowed)}")
    for field in positive:
        if knob(config, field) is not None and knob(config, field) < 1:
            raise ValueError(f"mixer.{field}={knob(config, field)} must be positive")
    if width is not None and (config.heads < 1 or width % config.heads):
        raise ValueError(f"mixer.heads={config.heads} must divide model.width={width}")
    if getattr(config, "short_conv", 0) < 0:
        raise ValueError(f"mixer.short_conv={config.short_conv} must be 0 (none) or a kernel size")


def knob(config: MixerConfig, field: str):
    """A config's field by its dotted name (`run.chunk`), as `mixer.<field>` names it on the command line."""
    return functools.reduce(getattr, field.split("."), config)


def check_temperature(temperature: float | None, learned: bool = False) -> None:
    """The rule for beta, the inverse temperature of the softmax rows (softmax attention, Hopfield): null takes the
    row's default, zero reads every visible key alike, and a negative beta would prefer the least similar key.
    Zero only where beta is fixed: a learned one is kept as its log."""
    if temperature is not None and (temperature < 0 or learned and temperature == 0):
        raise ValueError(f"mixer.temperature={temperature} must be positive, zero (a uniform read"
                         f"{'; not with mixer.learn_temperature' if learned else ''}) or null (the row's default)")


def mask_heads(o_bthd: jax.Array, head_mask: jax.Array | None) -> jax.Array:
    """Each head's read [B, T, H, d] times its multiplier in head_mask [H]."""
    if head_mask is None:
        return o_bthd
    return o_bthd * head_mask[None, None, :, None].astype(o_bthd.dtype)


# The output gate's activations, shared by the rows with a `gate_activation` knob: o = out(act(W_g x) * read)
GATE_ACTIVATIONS = {"silu": jax.nn.silu, "sigmoid": jax.nn.sigmoid}
