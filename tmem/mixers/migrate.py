"""A row's config as it was saved before its recipe and run were parts of their own, read under today's names.

Runs saved before the split hold a mixer node with the recipe's and the
run's fields at its top (`lr`, `microbatch`, `optim: {decay_steps,
weight_decay}`, `form`, `eval_form`, `chunk`, `sub_chunk`,
`implementation`); `migrate` moves them to `recipe.*` and `run.*`, and every
reader of a saved or composed mixer node goes through it (tmem.config), so
those runs restore, resume and are probed. A command line is not migrated: an
old name there is refused in one line naming the new one (`renamed`), so a
sweep says what it sweeps.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping

from tmem.mixers import config_type

# a field's name before the split -> its name in the row's recipe or run
RENAMED = {"lr": "recipe.lr", "microbatch": "recipe.microbatch", "optim.decay_steps": "recipe.decay_steps",
           "optim.weight_decay": "recipe.weight_decay", "form": "run.form", "eval_form": "run.eval_form",
           "chunk": "run.chunk", "sub_chunk": "run.sub_chunk", "implementation": "run.implementation"}


def _knobs(node: Mapping) -> set[str] | None:
    """The top-level fields of the row a node names (None: it names none, which validation reports): a row
    whose own knob has an old name (an outside row's `chunk`) keeps it."""
    try:
        return {f.name for f in dataclasses.fields(config_type(node))}
    except ValueError:
        return None


def migrate(node: Mapping) -> dict:
    """A mixer node (plain YAML values) with its fields from before the split under their new names; a node in
    today's names comes back equal. An old name's value wins over the part's default it lands on, as it is
    what the run set."""
    out = copy.deepcopy(dict(node))
    knobs = _knobs(out)
    if knobs is None:
        return out
    for old, new in RENAMED.items():
        top, _, inner = old.partition(".")
        holder = out.get(top) if inner else out
        if top in knobs or not isinstance(holder, dict) or (inner or top) not in holder:
            continue
        part, _, field = new.partition(".")
        out[part] = {**(out.get(part) or {}), field: holder.pop(inner or top)}
    if "optim" not in knobs and out.get("optim") == {}:
        del out["optim"]
    return out


def migrate_config(config: Mapping) -> dict:
    """A whole saved config (a run's `.hydra/config.yaml` or checkpoint metadata, plain values) with its mixer
    node and each hybrid entry migrated."""
    out = dict(config)
    if isinstance(out.get("mixer"), Mapping):
        out["mixer"] = migrate(out["mixer"])
    model = out.get("model")
    if isinstance(model, Mapping) and model.get("mixers"):
        out["model"] = {**model, "mixers": [migrate(e) if isinstance(e, Mapping) else e for e in model["mixers"]]}
    return out


def renamed(field: str, where: str, knobs: Mapping) -> str | None:
    """One line for a command line's old field name (`field` of the node at `where`, e.g. lr of mixer) that the
    node's row (its composed `knobs`) no longer has; None for any other field."""
    new = RENAMED.get(field)
    if new is None or field.partition(".")[0] in knobs:
        return None
    return (f"{where}.{field} is now {where}.{new}: a row's recipe (how it trains) and run (how it computes) are "
            f"parts of their own; write {where}.{new}=...")
