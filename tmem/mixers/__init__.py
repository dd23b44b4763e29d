"""The unified table: one row per sequence mixer, each a config and a layer on one protocol (base.py).

Adding a row is a module (its config extends MixerConfig, its layer is a
Mixer), one line in MIXERS and one YAML file under configs/mixer/.

`regression` is no row of its own: its config names a cell of the
test-time-regression grid by three knobs and resolves, when validated, to the
config of the row that computes it (tmem/mixers/regression.py). CONFIGS holds
every config a YAML may name; the layer is found from the resolved config's
type (`layer_of`).
"""

from typing import NamedTuple

from tmem.mixers.attention import SoftmaxAttention, SoftmaxConfig
from tmem.mixers.base import Mixer, MixerConfig, MixerState
from tmem.mixers.fast_weight import FastWeight, FastWeightConfig
from tmem.mixers.hopfield import Hopfield, HopfieldConfig
from tmem.mixers.lsa import LinearSelfAttention, LSAConfig
from tmem.mixers.mamba import Mamba, MambaConfig
from tmem.mixers.mesa import Mesa, MesaConfig
from tmem.mixers.none import NoMixer, NoneConfig
from tmem.mixers.regression import RegressionConfig
from tmem.mixers.rwkv7 import RWKV7, RWKV7Config
from tmem.mixers.titans import Titans, TitansConfig
from tmem.mixers.ttt import TTT, TTTConfig


class Row(NamedTuple):
    """A row of the table: its config's type (the schema of configs/mixer/<name>.yaml) and its layer."""

    config: type[MixerConfig]
    layer: type[Mixer]


FAST_WEIGHT = Row(FastWeightConfig, FastWeight)  # one write rule; each row's knobs are set by its YAML

MIXERS: dict[str, Row] = {
    "softmax": Row(SoftmaxConfig, SoftmaxAttention),
    "hopfield": Row(HopfieldConfig, Hopfield),  # softmax retrieval with keys tied to values (Chapter 6, D8)
    "lsa": Row(LSAConfig, LinearSelfAttention),
    "linear": FAST_WEIGHT,
    "retnet": FAST_WEIGHT,
    "gla": FAST_WEIGHT,
    "mamba2": FAST_WEIGHT,
    "deltanet": FAST_WEIGHT,
    "gated_deltanet": FAST_WEIGHT,
    "mamba": Row(MambaConfig, Mamba),  # Mamba-1: a decay per (channel, state) entry, a token scan
    "rwkv7": Row(RWKV7Config, RWKV7),  # the generalised delta rule: per-channel decay, removal along its own key
    "mesa": Row(MesaConfig, Mesa),  # online ridge regression: the optimiser "solve" (MesaNet)
    "ttt_linear": Row(TTTConfig, TTT),  # mini-batch gradient steps on x + LN(x W + b) (TTT-Linear)
    "ttt_mlp": Row(TTTConfig, TTT),  # the same on x + LN(MLP(x)) (TTT-MLP)
    "titans": Row(TitansConfig, Titans),  # an MLP memory by gradient descent with momentum and a forget gate
    "none": Row(NoneConfig, NoMixer),  # no mixing: each position alone (the slow memory's one-block model)
}

# every config a mixer YAML may name: the rows', and the grid's, which resolves to one of theirs
CONFIGS: dict[str, type[MixerConfig]] = {**{name: row.config for name, row in MIXERS.items()},
                                         "regression": RegressionConfig}
_LAYERS = {row.config: row.layer for row in MIXERS.values()}


def layer_of(config: MixerConfig) -> type[Mixer]:
    """The layer that computes a (resolved) config: one layer per config type."""
    return _LAYERS[type(config)]


__all__ = ["CONFIGS", "MIXERS", "Mixer", "MixerConfig", "MixerState", "Row", "layer_of"]
