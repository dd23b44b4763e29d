"""The unified table: one row per sequence mixer, each a config and a layer on one protocol (base.py).

Adding a row is a module (its config extends MixerConfig, its layer is a
Mixer), one line in MIXERS and one YAML file under configs/mixer/. A row from
outside the package needs neither: its YAML, in the researcher's own config
directory, names its `Row` by import path (`_row_: mypkg.memory.ROW`), and
`config_type` imports it wherever a config is read, so a restored run
imports the row it was trained with (docs/add-a-memory.md).

`regression` is no row of its own: its config names a cell of the
test-time-regression grid by three knobs and resolves, when validated, to the
config of the row that computes it (tmem/mixers/regression.py). CONFIGS holds
every config a YAML may name; the layer is found from the resolved config's
type (`layer_of`).
"""

import functools
import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from omegaconf import OmegaConf

from tmem.mixers.attention import SoftmaxAttention, SoftmaxConfig
from tmem.mixers.base import Mixer, MixerConfig, MixerState
from tmem.mixers.fast_weight import FastWeight, FastWeightConfig
from tmem.mixers.hopfield import Hopfield, HopfieldConfig
from tmem.mixers.lsa import LinearSelfAttention, LSAConfig
from tmem.mixers.mamba import Mamba, MambaConfig
from tmem.mixers.mesa import Mesa, MesaConfig
from tmem.mixers.mla import MLA, MLAConfig
from tmem.mixers.none import NoMixer, NoneConfig
from tmem.mixers.regression import RegressionConfig
from tmem.mixers.rwkv7 import RWKV7, RWKV7Config
from tmem.mixers.titans import Titans, TitansConfig
from tmem.mixers.ttt import TTT, TTTConfig
from tmem.structured import structured


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
    "mla": Row(MLAConfig, MLA),  # softmax attention whose cache is a low-rank latent and a shared rotary key
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
YAMLS = Path(__file__).resolve().parents[2] / "configs" / "mixer"  # configs/mixer/<row>.yaml


@functools.cache
def row_configs() -> tuple[MixerConfig, ...]:
    """Every row's config as its YAML file sets it: its values over its config type's defaults, which are the
    base the file extends (tmem.config.register_bases)."""
    def read(name: str) -> MixerConfig:
        node = OmegaConf.to_container(OmegaConf.load(YAMLS / f"{name}.yaml"), resolve=True)
        return structured(MIXERS[name].config, {k: v for k, v in node.items() if k != "defaults"})

    return tuple(read(name) for name in MIXERS)


RegressionConfig.rows = staticmethod(row_configs)  # the grid's named cells are the rows' YAMLs


ROW_KEY = "_row_"  # a mixer YAML's key naming a row from outside the package by import path; no config field


def config_type(node: Mapping) -> type[MixerConfig]:
    """The config type a mixer node (a YAML's composed mapping) names: the row whose `name` it has, or the row its
    `_row_` imports. ValueError, in one line, for a name or import path that names no row."""
    if node.get(ROW_KEY) is not None:
        return import_row(str(node[ROW_KEY])).config
    name = node.get("name")
    if name not in CONFIGS:
        raise ValueError(f"mixer.name={name!r} is not one of: {', '.join(CONFIGS)} (or name a row from outside "
                         f"tmem by import path in mixer.{ROW_KEY})")
    return CONFIGS[name]


def import_row(path: str) -> Row:
    """The `Row` at `path` ("package.module.NAME"), imported and its layer made known to `layer_of`."""
    module, _, attribute = path.rpartition(".")
    try:
        row = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"mixer.{ROW_KEY}={path}: cannot import it ({type(e).__name__}: {e}); put its package on "
                         "PYTHONPATH and name a Row(config, layer) as package.module.NAME") from None
    valid = (isinstance(row, tuple) and len(row) == 2 and isinstance(row[0], type) and isinstance(row[1], type)
             and issubclass(row[0], MixerConfig) and issubclass(row[1], Mixer))
    if not valid:
        raise ValueError(f"mixer.{ROW_KEY}={path} is a {type(row).__name__}, not a tmem.mixers.Row(config, layer) of "
                         "a MixerConfig subclass and a Mixer subclass")
    row = Row(*row)
    _LAYERS.setdefault(row.config, row.layer)
    return row


def layer_of(config: MixerConfig) -> type[Mixer]:
    """The layer that computes a (resolved) config: one layer per config type."""
    if type(config) not in _LAYERS:
        raise ValueError(f"mixer {config.name!r}: {type(config).__name__} is no row's config; name its Row in "
                         f"mixer.{ROW_KEY}")
    return _LAYERS[type(config)]


__all__ = ["CONFIGS", "MIXERS", "ROW_KEY", "Mixer", "MixerConfig", "MixerState", "Row", "config_type", "import_row",
           "layer_of", "row_configs"]
