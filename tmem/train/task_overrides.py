"""Eval-time task overrides: a trained model read on a changed task (longer sequences, more pairs).

    python eval.py run=<run dir> 'probes=[heldout]' task.seq_len=256 task.num_kv_pairs=32

replaces those fields of the run's saved task and leaves every other part of
its config as trained. That matters for the mixer: its "auto" knobs were
fitted to the trained task (softmax's `train_length`, the length its length
scaling treats as 1), and refitting them to the evaluated task would change
the model being measured. So the mixer config is never refitted here.

The model is rebuilt from the trained config, so an override may not change
what its parameters are shaped by: the vocabulary may not outgrow the
embedding, a vector task keeps its token size, and a learned position table
(learned or shortformer positions) has no rows beyond the trained length.
Each refusal is one ConfigError line, raised before anything is restored.
"""

from __future__ import annotations

import dataclasses

from omegaconf import OmegaConf

from tmem.config import ConfigError, parse_group
from tmem.schema import Config

LEARNED_TABLES = ("learned", "shortformer")  # positions held in a table of the trained length


def spelled(overrides: dict) -> str:
    """The overrides as a command line spells them, sorted: `task.num_kv_pairs=32,task.seq_len=256`.

    Also the name of the folder their reports go to, so the same overrides in
    any order land in the same folder.
    """
    return ",".join(f"task.{key}={_value(value)}" for key, value in sorted(overrides.items()))


def _value(value) -> str:
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(map(_value, value)) + "]"
    return str(value)


def with_task(cfg: Config, overrides: dict | None) -> Config:
    """The run's config with its task's fields replaced by `overrides` (field -> value); ConfigError in one line."""
    if not overrides:
        return cfg
    trained, where = cfg.task, spelled(overrides)
    fields = [f.name for f in dataclasses.fields(trained)]
    for key in overrides:
        if key == "name":
            raise ConfigError(f"task.name={overrides[key]}: an evaluation reads the run's own task "
                              f"({trained.name!r}); override its fields instead, e.g. task.seq_len=...")
        if key not in fields:
            raise ConfigError(f"task.{key}: task {trained.name!r} has no such field; allowed: {', '.join(fields)}")
    if isinstance(overrides.get("seq_len"), int):  # before the task's own checks: the table is the first problem
        _check_table(cfg, overrides["seq_len"], where)
    node = OmegaConf.create({**dataclasses.asdict(trained), **overrides})
    try:
        task = parse_group("task", type(trained), node)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    _check_table(cfg, task.seq_len, where)  # seq_len may follow from other fields (linreg's num_examples)
    if trained.input_kind == "vectors" and task.token_dim != trained.token_dim:
        raise ConfigError(f"{where} gives tokens of {task.token_dim} coordinates, but the run's model reads "
                          f"{trained.token_dim}: keep the fields that set the token size as trained")
    if trained.vocab_size is not None and task.vocab_size > trained.vocab_size:
        raise ConfigError(f"{where} gives a vocabulary of {task.vocab_size} tokens, more than the run's embedding "
                          f"holds ({trained.vocab_size}): evaluate within the trained vocabulary")
    return dataclasses.replace(cfg, task=task)


def _check_table(cfg: Config, seq_len: int, where: str) -> None:
    trained = cfg.task.seq_len
    if cfg.model.positions in LEARNED_TABLES and seq_len > trained:
        raise ConfigError(f"{where}: sequences of {seq_len} tokens run past the run's learned position table "
                          f"(model.positions={cfg.model.positions}, {trained} rows): evaluate at most {trained} "
                          "tokens, or train with model.positions=rope or none")
