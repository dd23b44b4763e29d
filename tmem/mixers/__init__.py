"""Sequence mixers, one per row of the unified table. Adding one is a module,
one line in MIXERS (its config dataclass and its module) and one YAML file."""

from tmem.mixers.attention import SoftmaxAttention, SoftmaxConfig
from tmem.mixers.none import NoMixer, NoneConfig

MIXERS: dict[str, tuple[type, type]] = {
    "softmax": (SoftmaxConfig, SoftmaxAttention),
    "none": (NoneConfig, NoMixer),
}

__all__ = ["MIXERS"]
