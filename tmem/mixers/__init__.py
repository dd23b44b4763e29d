"""Sequence mixers, one per row of the unified table. Adding one is a module,
one line in MIXERS (its config dataclass and its module) and one YAML file."""

from tmem.mixers.attention import SoftmaxAttention, SoftmaxConfig

MIXERS: dict[str, tuple[type, type]] = {
    "softmax": (SoftmaxConfig, SoftmaxAttention),
}

__all__ = ["MIXERS"]
