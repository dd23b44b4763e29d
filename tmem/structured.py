"""A mapping of values made into a frozen dataclass, as OmegaConf's structured configs check and convert it.

Validation (tmem.config) reads every group's YAML through it, and the grid
(tmem.mixers.row_configs) the rows' YAML files: one reading of a YAML node.
"""

from __future__ import annotations

import dataclasses

from omegaconf import DictConfig, OmegaConf


def structured(schema: type, values: dict):
    """`values` over `schema`'s defaults, as a frozen `schema`; OmegaConf's exceptions (an unknown field, a value
    of the wrong type) and the dataclass's own ValueError and TypeError propagate."""
    parsed = OmegaConf.to_object(OmegaConf.merge(_writable(OmegaConf.structured(schema)), values))
    # OmegaConf gives a tuple field a list; a config must hash (jit takes a model's structure, which holds its
    # mixer's config, as static)
    lists = {f.name: tuple(getattr(parsed, f.name)) for f in dataclasses.fields(parsed)
             if str(f.type).startswith("tuple") and isinstance(getattr(parsed, f.name), list)}
    return dataclasses.replace(parsed, **lists) if lists else parsed


def _writable(node: DictConfig) -> DictConfig:
    """A frozen dataclass's node with its read-only flag cleared on it and on every nested dataclass's node (each
    carries its own, mixer.recipe's too), so that values merge into it; the dataclass made from it stays frozen."""
    OmegaConf.set_readonly(node, False)
    for child in node.values():
        if isinstance(child, DictConfig):
            _writable(child)
    return node
