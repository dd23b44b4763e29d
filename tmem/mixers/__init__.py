"""Sequence mixers, one per row of the unified table. Adding one is a module,
one line in MIXERS (its config dataclass and its module) and one YAML file."""

from tmem.mixers.attention import SoftmaxAttention, SoftmaxConfig
from tmem.mixers.fast_weight import FastWeight, FastWeightConfig
from tmem.mixers.lsa import LinearSelfAttention, LSAConfig
from tmem.mixers.none import NoMixer, NoneConfig

MIXERS: dict[str, tuple[type, type]] = {
    "softmax": (SoftmaxConfig, SoftmaxAttention),
    "lsa": (LSAConfig, LinearSelfAttention),
    # the fast-weight rows: one write rule, its knobs set by configs/mixer/<row>.yaml
    "linear": (FastWeightConfig, FastWeight),
    "retnet": (FastWeightConfig, FastWeight),
    "gla": (FastWeightConfig, FastWeight),
    "mamba2": (FastWeightConfig, FastWeight),
    "deltanet": (FastWeightConfig, FastWeight),
    "gated_deltanet": (FastWeightConfig, FastWeight),
    "none": (NoneConfig, NoMixer),  # no mixing: each position alone (the slow memory's one-block model)
}

__all__ = ["MIXERS"]
