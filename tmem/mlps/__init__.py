"""The slow memories: the MLP group, one config type and one layer per kind, as the mixers' table has rows.

Adding one is a module (its config extends MLPConfig, its layer maps
[..., width] to [..., width] position by position), one line in MLPS, its
count in tmem/mlps/flops.py and one YAML file under configs/mlp/ naming its
base (`base_<module>`). `none` has no layer: the block then has no MLP and no
norm before it.
"""

from typing import NamedTuple

from flax import nnx

from tmem.mlps.base import AuxiliaryLoss, MLPConfig, with_auxiliary_losses
from tmem.mlps.dense import Dense, DenseConfig
from tmem.mlps.moe import MoE, MoEConfig
from tmem.mlps.pkm import PKMConfig, ProductKeyMemory


class Kind(NamedTuple):
    """An MLP of the table: its config's type (the schema of configs/mlp/<name>.yaml) and its layer."""

    config: type[MLPConfig]
    layer: type[nnx.Module] | None


DENSE = Kind(DenseConfig, Dense)  # one layer; the score function is the name

MLPS: dict[str, Kind] = {
    "none": Kind(DenseConfig, None),  # attention-only blocks
    "linear": DENSE,
    "relu": DENSE,
    "relu2": DENSE,
    "relu3": DENSE,  # the cubed ReLU of the slides' capacity table
    "gelu": DENSE,
    "swiglu": DENSE,
    "moe": Kind(MoEConfig, MoE),  # top_k of E experts, with a load-balancing loss
    "pkm": Kind(PKMConfig, ProductKeyMemory),  # a table of keys^2 values read by product keys
}
CONFIGS: dict[str, type[MLPConfig]] = {name: kind.config for name, kind in MLPS.items()}


def layer_of(config: MLPConfig) -> type[nnx.Module] | None:
    """The layer that computes a config, or None for no MLP."""
    return MLPS[config.name].layer


__all__ = ["CONFIGS", "MLPS", "AuxiliaryLoss", "Dense", "DenseConfig", "Kind", "MLPConfig", "MoE", "MoEConfig",
           "PKMConfig", "ProductKeyMemory", "layer_of", "with_auxiliary_losses"]
