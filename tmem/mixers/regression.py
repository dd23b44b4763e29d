"""The regression mixer: any cell of the test-time-regression grid, chosen by its three knobs.

The slides ("Test-time regression: three knobs") write every fast-weight layer
as solving, inside its forward pass,

    min over m in M of  1/2 sum_i gamma_i^(t) || v_i - m(k_i) ||^2,

and the rows differ in three choices: the weights gamma (`weights`), the
function class M (`function`) and the optimiser (`optimizer`). A cell resolves,
when the config is validated, to the layer that computes it: the named row's
own config where a paper names the cell (so the preset is that row, with the
same parameters at the same head count), else the layer of its nearest
family with the knobs set:

| weights    | function      | optimizer        | is             |
|------------|---------------|------------------|----------------|
| uniform    | linear        | one_step         | linear         |
| decay      | linear        | one_step         | retnet         |
| gate       | linear        | one_step         | mamba2         |
| uniform    | linear        | sgd              | deltanet       |
| uniform    | linear        | sgd, gated decay | gated_deltanet |
| gate       | linear        | exact            | mesa           |
| uniform    | linear        | minibatch        | ttt_linear     |
| uniform    | mlp           | minibatch        | ttt_mlp        |
| uniform    | mlp           | momentum, gated  | titans         |
| similarity | nonparametric | exact            | softmax        |

An iterative optimiser (sgd, minibatch, momentum) cannot reweigh the pairs it
has already written: a decaying or gated weighting of the past enters it as a
weight decay of the memory, `weight_decay` fixed | gated, which is what the
slides call Gated DeltaNet's "SGD with weight decay". `weights=decay` or
`gate` with an iterative optimiser says the same thing, and is the same cell.
Every other iterative cell is the titans layer (tmem/mixers/titans.py) with
momentum, forget gate and mini-batch set by the knobs. GLA's per-channel decay
is not a weight on pairs, so GLA is no cell.

Softmax attention is the slides' last row: weights by similarity to the query,
gamma_i = exp(beta q . k_i), and the non-parametric (locally constant) class,
whose exact minimiser is the weighted mean of the values. Similarity weights
exist only once the query does, so no memory written before it can use them,
and a non-parametric class has no weights to step: the only cell of either is
softmax's, and every other is refused.

A learned write strength (MesaNet's beta, DeltaNet's, TTT's per-token rate) is
its own knob, `write_strength`. In an exact solve it can only be a factor of
each pair's weight, so it is there exactly when the weights come from the
token (gate: MesaNet's own beta) and `weights=uniform` is uniform; elsewhere it
is the optimiser's step size, and each row keeps its own unless told.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import ClassVar

from tmem.mixers.base import Cell, MixerConfig, Recipe, check_knobs, recommended

WEIGHTS = ("uniform", "decay", "gate", "similarity")
FUNCTIONS = ("linear", "mlp", "nonparametric")
OPTIMIZERS = ("one_step", "sgd", "minibatch", "momentum", "exact")
ITERATIVE = ("sgd", "minibatch", "momentum")
WEIGHT_DECAYS = ("none", "fixed", "gated")
INITIALS = ("auto", "zero", "learned")
WRITE_STRENGTHS = ("auto", "learned", "none")
DECAY_OF = {"uniform": "none", "decay": "fixed", "gate": "gated"}  # the weights as an iterative rule's weight decay


@dataclasses.dataclass(frozen=True)
class RegressionConfig(MixerConfig):
    """The three knobs (and the initial memory); `fit` turns them into the layer's own config."""

    name: str = "regression"
    recipe: Recipe = recommended(lr=1e-2)
    # gamma: uniform | decay (fixed per head) | gate (from the token) | similarity (to the query: softmax's)
    weights: str = "uniform"
    function: str = "linear"  # linear | mlp | nonparametric (softmax's locally constant fit)
    optimizer: str = "one_step"  # one_step | sgd (per token) | minibatch | momentum | exact (ridge solve)
    weight_decay: str = "none"  # of the memory, for iterative optimisers: none | fixed | gated
    initial: str = "auto"  # the memory before the first token: zero | learned; auto: learned for an MLP and for
    # minibatch and momentum (TTT's and Titans' learned initial weights), zero otherwise
    mini_batch: int = 16  # tokens per gradient step of minibatch and momentum
    # a learned per-token strength of each write: learned | none; auto: in an exact cell only with gated weights
    # (there it is a factor of the weights), elsewhere the computing row's own (an optimiser's step size)
    write_strength: str = "auto"
    heads: int = 4  # every cell's, named or not, so that the cells of a sweep differ in their knobs alone

    # the built-in rows' configs as their YAML files set them, where the named cells are read from (given by the
    # table, tmem.mixers.row_configs, so that the grid repeats no row's settings and imports no row)
    rows: ClassVar[Callable[[], tuple[MixerConfig, ...]]] = staticmethod(lambda: ())

    def cell(self) -> Cell:
        """(weights, function, optimizer, initial), with an iterative rule's weight decay folded into the
        weights and initial resolved; ValueError, in one line, for a cell that cannot work."""
        check_knobs(self, choices={"weights": WEIGHTS, "function": FUNCTIONS, "optimizer": OPTIMIZERS,
                                   "weight_decay": WEIGHT_DECAYS, "initial": INITIALS,
                                   "write_strength": WRITE_STRENGTHS}, positive=("mini_batch",))
        similarity = self.weights == "similarity"
        if similarity and self.function != "nonparametric":
            raise ValueError(f"mixer.weights=similarity with mixer.function={self.function}: similarity weights are a "
                             "function of the query, and a memory is written before any query; only a "
                             "non-parametric read, which recomputes them per query, can use them: set "
                             "mixer.function=nonparametric")
        if self.function == "nonparametric" and not similarity:
            raise ValueError(f"mixer.function=nonparametric with mixer.weights={self.weights}: weights that do not "
                             "depend on the query give every query the same fit (a weighted mean of the values); "
                             "set mixer.weights=similarity")
        if self.function == "nonparametric" and self.optimizer != "exact":
            raise ValueError(f"mixer.optimizer={self.optimizer} with mixer.function=nonparametric: a non-parametric "
                             "class has no weights for an optimiser to step; its fit is the exact weighted mean: use "
                             "mixer.optimizer=exact")
        weights, optimizer = self.weights, self.optimizer
        if self.weight_decay != "none":
            if optimizer not in ITERATIVE:
                raise ValueError(f"mixer.weight_decay={self.weight_decay} needs an iterative optimizer (sgd, "
                                 f"minibatch, momentum); {optimizer} weighs the pairs itself: set mixer.weights")
            if weights != "uniform" and DECAY_OF[weights] != self.weight_decay:
                raise ValueError(f"mixer.weights={weights} and mixer.weight_decay={self.weight_decay} disagree: for "
                                 "an iterative optimizer both are the memory's decay; set one of them")
            weights = {"fixed": "decay", "gated": "gate"}[self.weight_decay]
        initial = self.initial
        if initial == "auto":
            initial = "learned" if self.function == "mlp" or optimizer in ("minibatch", "momentum") else "zero"
        if self.function == "mlp" and optimizer == "exact":
            raise ValueError("mixer.optimizer=exact with mixer.function=mlp: only a linear memory has a closed-form "
                             "solve; use an iterative optimizer (sgd, minibatch, momentum) for an MLP")
        if self.function == "mlp" and initial == "zero":
            raise ValueError("mixer.initial=zero with mixer.function=mlp: every gradient of an MLP at zero is zero, "
                             "so it would never write; use mixer.initial=learned")
        if optimizer == "exact" and initial == "learned":
            raise ValueError("mixer.initial=learned with mixer.optimizer=exact: the exact solve is the minimiser "
                             "itself and starts from nothing; use mixer.initial=zero")
        return weights, self.function, optimizer, initial

    def resolve(self) -> MixerConfig:
        """The config of the layer that computes this cell: a named row's own config (as its YAML sets it), else
        the nearest family's with the knobs set: the named row of the cell's optimiser with uniform weights,
        else the first row whose layer can compute it (`MixerConfig.at_cell`)."""
        cell = self.cell()
        strength = self.write_strength
        if strength == "auto":  # in an exact solve a weight of the pairs; elsewhere the computing row's step size
            strength = ("learned" if cell[0] == "gate" else "none") if cell[2] == "exact" else None
        named = {row.cell(): row for row in self.rows() if row.cell() is not None}
        nearest = [named.get(cell), named.get(("uniform", *cell[1:])), *named.values()]
        computed = (row.at_cell(cell, self.mini_batch, self.heads, strength) for row in nearest if row is not None)
        row = next((config for config in computed if config is not None), None)
        if row is None:
            raise ValueError(f"mixer.write_strength={self.write_strength}: no row's layer computes the cell "
                             f"({', '.join(cell[:3])}) {'without' if strength == 'none' else 'with'} a learned write "
                             "strength; set mixer.write_strength=auto")
        # the grid's rate, schedule and slice of the batch, not the row's: every cell of a sweep trains alike
        return dataclasses.replace(row, name="regression", recipe=self.recipe)

    def check(self, width: int) -> None:
        self.resolve().check(width)

    def fit(self, task, width: int) -> MixerConfig:
        return self.resolve().fit(task, width)

    def state_size(self, width: int, seq_len: int) -> int:
        return self.resolve().state_size(width, seq_len)
