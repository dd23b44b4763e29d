"""A composed config made typed, checked before anything compiles, and the Hydra nodes the YAML files extend.

Hydra composes YAML; `validate` turns the result into the frozen dataclasses
of tmem.schema (and tasks.TASKS, tmem.mixers.CONFIGS, tmem.mlps.CONFIGS, beside
their code, so adding a task, a row or an MLP needs no edit here), fills in what a row recommends,
and turns every problem into one `ConfigError` line naming the field and
what is allowed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, OmegaConfBaseException

from tasks import TASKS
from tasks.examples import MAX_POSITION
from tmem.mixers import CONFIGS, ROW_KEY, MixerConfig, config_type
from tmem.mixers.base import Recipe
from tmem.mixers.migrate import migrate, renamed
from tmem.mlps import CONFIGS as MLP_CONFIGS
from tmem.schema import ClusterConfig, Config, LoggerConfig, ModelConfig, OptimConfig, TrainConfig
from tmem.structured import structured


INT32_MAX = 2**31 - 1


class ConfigError(ValueError):
    """A bad config, described in one line."""


def task_target(name: str) -> float | None:
    """train.target's default: the named task's own (an unknown task is reported by validate)."""
    return getattr(TASKS.get(name), "default_target", None)


def row_steps(recommended: int | None) -> int:
    """train.steps's default: the mixer group's recommendation (mixer.recipe.steps, checked as the Recipe checks
    it), else TrainConfig's. A hybrid reads its mixer group's (softmax unless chosen), not its entries': give it
    train.steps."""
    return Recipe(steps=recommended).steps or TrainConfig.steps


OmegaConf.register_new_resolver("tmem.task_target", task_target, replace=True)
OmegaConf.register_new_resolver("tmem.row_steps", row_steps, replace=True)


def resolve_auto(model: ModelConfig, layers: tuple[MixerConfig, ...], task) -> ModelConfig:
    """The model's "auto" settings made concrete, once, so no module guesses them later.

    Positions: rope where a layer's mixer has no form without it (MLA), else
    shortformer where a layer's mixer takes query and key inputs (on
    MQAR it trains faster than RoPE and costs less per step; in a hybrid only
    those layers receive them), none elsewhere: recurrent mixers know order
    from their recurrence, and the in-context regression prompt of a vector
    task is a set of pairs. Read-in (vector tasks): identity when the width is
    the token size, else learned.
    """
    vectors = task.input_kind == "vectors"
    if model.positions == "auto":
        qk = not vectors and any(layer.takes_qk_positions for layer in layers)
        rotary = any(layer.needs_rope for layer in layers)
        model = dataclasses.replace(model, positions="rope" if rotary else "shortformer" if qk else "none")
    if vectors and model.read_in == "auto":
        model = dataclasses.replace(model, read_in="identity" if model.width == task.token_dim else "learned")
    return model


_FIXED = {"model": ModelConfig, "optim": OptimConfig, "logger": LoggerConfig, "train": TrainConfig}


def parse_group(section: str, schema: type, node: Any, drop: tuple[str, ...] = ()):
    """One group's YAML node -> its dataclass, or a one-line ConfigError."""
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{section}: expected a mapping of fields, got {node!r}")
    allowed = ", ".join(f.name for f in dataclasses.fields(schema) if f.name not in drop)
    try:
        values = {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if k not in drop}
        parsed = structured(schema, values)
    except OmegaConfBaseException as e:
        key = str(getattr(e, "full_key", None) or getattr(e, "key", None) or "?")
        key = key.removeprefix(f"{section}.")  # a failed interpolation names the node from the config's root
        first = str(e).splitlines()[0]
        if isinstance(e, InterpolationResolutionError) and "raised while resolving interpolation: " in first:
            # a resolver's own message (tmem.row_steps names the field), not OmegaConf's frame around it
            raise ConfigError(first.split("raised while resolving interpolation: ", 1)[1]) from None
        if "not in" in first:
            raise ConfigError(f"{section}.{key}: unknown field; allowed: {allowed}") from None
        raise ConfigError(f"{section}.{key}: {first}") from None
    except (ValueError, TypeError) as e:
        message = str(e) if str(e).startswith(section) else f"{section}: {e}"
        raise ConfigError(message) from None
    _int32(section, parsed)
    return parsed


def plain(config) -> dict:
    """A config dataclass as plain YAML and JSON values (the inverse of `parse_group`): nested configs as dicts,
    tuples as lists."""
    return dataclasses.asdict(config, dict_factory=lambda fields: {k: list(v) if isinstance(v, tuple) else v
                                                                   for k, v in fields})


def _int32(section: str, parsed) -> None:
    """Every integer of a group (a nested dataclass's too) in int32's range: tmem keeps counts, sizes, steps and
    seeds in int32 on the device, where a larger one fails inside a jitted program (or wraps around silently)."""
    for f in dataclasses.fields(parsed):
        value = getattr(parsed, f.name)
        if dataclasses.is_dataclass(value):
            _int32(f"{section}.{f.name}", value)
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT32_MAX:
            raise ConfigError(f"{section}.{f.name}={value} must be at most {INT32_MAX} in size: tmem keeps "
                              "counts, sizes, steps and seeds in int32")


def _registered(section: str, node: Any, registry: dict):
    name = node.get("name") if isinstance(node, DictConfig) else None
    if name not in registry:
        raise ConfigError(f"{section}.name={name!r} is not one of: {', '.join(registry)}")
    return name


def _mixer_type(node: Any) -> type[MixerConfig]:
    """The config type the mixer group names: a built-in row, or one from outside tmem imported (mixer._row_)."""
    try:
        return config_type(node if isinstance(node, DictConfig) else {})
    except ValueError as e:
        raise ConfigError(str(e)) from None


def row_node(name: str) -> dict:
    """configs/mixer/<name>.yaml as Hydra composes it (its base from the ConfigStore), every field written out, in
    today's field names (a YAML of a researcher's own may hold the names from before the recipe and run were
    parts of their own)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():  # inside train.py's Hydra app, or a caller's compose context
        return migrate(OmegaConf.to_container(compose(f"mixer/{name}").mixer, resolve=True))
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return migrate(OmegaConf.to_container(compose(f"mixer/{name}").mixer, resolve=True))


def hybrid_entries(cfg: DictConfig) -> list[dict]:
    """model.mixers written out in full (none for a plain stack): each entry its row's YAML, then what the
    command line or an experiment changed in the mixer group when the group names the same row, then the
    entry's own knobs. So `mixer.heads=2` (the mixer group is softmax unless chosen) reaches the softmax layers
    of a hybrid, and a change the hybrid has no layer of that row for is refused. An entry may name a row from
    outside tmem by import path (`{_row_: pkg.module.ROW}`), whose node is its config's defaults."""
    entries = cfg.model.get("mixers") or []
    if not entries:
        return []
    if not isinstance(entries, ListConfig):
        raise ConfigError(f"model.mixers={entries!r} must be a list of rows: [gated_deltanet,softmax]")
    group = OmegaConf.to_container(cfg.mixer, resolve=True) if isinstance(cfg.get("mixer"), DictConfig) else {}
    group = migrate(group)
    own = row_node(group["name"]) if group.get("name") in CONFIGS else group
    changes = {k: v for k, v in group.items() if own.get(k) != v}
    full = []
    for i, entry in enumerate(entries):
        knobs = OmegaConf.to_container(entry, resolve=True) if isinstance(entry, DictConfig) else {"name": entry}
        row = _entry_row(f"model.mixers[{i}]", knobs)
        full.append(OmegaConf.to_container(OmegaConf.merge(row, changes if row["name"] == group["name"] else {},
                                                           knobs)))
    if changes and group["name"] not in [entry["name"] for entry in full]:
        field, value = next(iter(changes.items()))
        if isinstance(value, dict):  # a part (mixer.run): name the field in it that changed
            inner, value = next((k, v) for k, v in value.items() if (own.get(field) or {}).get(k) != v)
            field = f"{field}.{inner}"
        raise ConfigError(f"mixer.{field}={value!r} changes {group['name']}, which model.mixers has no layer of: "
                          f"give it in an entry, e.g. 'model.mixers=[{{name:{full[0]['name']},{field}:...}},...]'")
    return full


def _entry_row(where: str, knobs: dict) -> dict:
    """The node a hybrid entry's knobs go over: its built-in row's YAML, or the defaults of the outside row its
    `_row_` imports; ConfigError for a name that is neither, or a knob under its name from before the split."""
    if knobs.get(ROW_KEY) is not None:
        schema = _mixer_type(OmegaConf.create(knobs))
        row = {**plain(schema()), ROW_KEY: knobs[ROW_KEY]}
    elif knobs.get("name") in CONFIGS:
        row = row_node(knobs["name"])
    else:
        raise ConfigError(f"{where}.name={knobs.get('name')!r} is not one of: {', '.join(CONFIGS)} (or name a row "
                          f"from outside tmem by import path in {where}.{ROW_KEY})")
    fields = [f"{k}.{inner}" if isinstance(v, dict) else k for k, v in knobs.items()
              for inner in (v if isinstance(v, dict) else [None])]
    for field in fields:
        problem = renamed(field, where, row)
        if problem:
            raise ConfigError(problem)
    return row


def saved_form(cfg: DictConfig) -> dict:
    """The composed config as a run saves and compares it on resume: resolved, a hybrid's entries written out in
    full, so the run restores as it trained whatever its rows' YAML files say later."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    entries = hybrid_entries(cfg)
    if entries:
        resolved["model"]["mixers"] = entries
    return resolved


def with_new_fields(saved: dict) -> dict:
    """A saved config (plain values, today's names) with each field added to its group since the run was saved
    set to today's default: a new field's default keeps the behaviour from before it existed (MQAR's
    distractor_pairs=0 makes the examples it made before), so an old run resumes and restores as it trained.
    A hybrid's entries are filled as the mixer group is."""
    out = {section: dict(node) if isinstance(node, dict) else node for section, node in saved.items()}
    schemas = {**_FIXED, "cluster": ClusterConfig, "task": lambda node: TASKS[node["name"]],
               "mlp": lambda node: MLP_CONFIGS[node["name"]], "mixer": config_type}
    for section, node in out.items():
        if isinstance(node, dict) and section in schemas:
            _fill(node, schemas[section])
    entries = (out.get("model") or {}).get("mixers") if isinstance(out.get("model"), dict) else None
    if isinstance(entries, list):
        out["model"]["mixers"] = [_fill(dict(e), config_type) if isinstance(e, dict) else e for e in entries]
    return out


def _fill(node: dict, schema) -> dict:
    """`node` with each field of its schema it lacks at the field's default (a schema type, or a function of the
    node giving it), in its parts too (a row's recipe and run); a node naming no known schema is left for
    validation to name."""
    if not isinstance(schema, type):
        try:
            schema = schema(node)
        except (KeyError, ValueError):
            return node
    for f in dataclasses.fields(schema):
        if f.name == "mixers":
            continue
        if f.name in node:
            part = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
            if isinstance(node[f.name], dict) and dataclasses.is_dataclass(part):
                node[f.name] = {**plain(part), **node[f.name]}
            continue
        if f.default is not dataclasses.MISSING:
            node[f.name] = list(f.default) if isinstance(f.default, tuple) else f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
            node[f.name] = plain(default) if dataclasses.is_dataclass(default) else default
    return node


def _fitted(section: str, node: Any, task, width: int) -> MixerConfig:
    """A mixer's node (migrated: a YAML of a researcher's own may hold names from before the split) parsed into
    its row's config and fitted to the task and width; its errors name `section`."""
    if isinstance(node, DictConfig):
        node = OmegaConf.create(migrate(OmegaConf.to_container(node, resolve=True)))
    mixer = parse_group(section, _mixer_type(node), node, drop=(ROW_KEY,))
    try:
        mixer = mixer.fit(task, width)
        mixer.check(width)
        return mixer
    except ValueError as e:
        raise ConfigError(str(e).replace("mixer.", f"{section}.")) from None


def validate(cfg: DictConfig) -> Config:
    """Check a composed config and return it typed; raises ConfigError."""
    for section in ("task", "mixer", "mlp", *_FIXED):
        if section not in cfg:
            raise ConfigError(f"{section}: missing config group")
    task_name = _registered("task", cfg.task, TASKS)
    task = parse_group("task", TASKS[task_name], cfg.task, drop=("name",))
    mlp = parse_group("mlp", MLP_CONFIGS[_registered("mlp", cfg.mlp, MLP_CONFIGS)], cfg.mlp)
    fixed = {section: parse_group(section, schema, cfg[section], drop=("mixers",) if section == "model" else ())
             for section, schema in _FIXED.items()}
    width = fixed["model"].width
    entries = hybrid_entries(cfg)
    if entries:
        layers = tuple(_fitted(f"model.mixers[{i}]", OmegaConf.create(node), task, width)
                       for i, node in enumerate(entries))
        fixed["model"] = dataclasses.replace(fixed["model"], mixers=layers)
        mixer = lead(layers)
    else:
        mixer = _fitted("mixer", cfg.mixer, task, width)
    fixed["optim"] = _recommended(fixed["optim"], mixer)
    if fixed["train"].microbatch == "auto":
        try:
            fixed["train"] = dataclasses.replace(fixed["train"], microbatch=mixer.recipe.microbatch)
        except ValueError as e:
            raise ConfigError(f"{e} (train.microbatch=auto takes mixer.recipe.microbatch; set train.microbatch)"
                              ) from None
    cluster = parse_group("cluster", ClusterConfig, cfg.cluster) if "cluster" in cfg else ClusterConfig()
    config = Config(task=task, mixer=mixer, mlp=mlp, name=cfg.get("name"), cluster=cluster, **fixed)
    _check_together(config)
    return dataclasses.replace(config, model=resolve_auto(config.model, config.layers, task))


def lead(layers: tuple[MixerConfig, ...]) -> MixerConfig:
    """The entry of a hybrid whose recommended recipe (rate, schedule, microbatch) trains the whole stack: the
    one with the smallest rate, the first of equals. One model takes one rate, and a rate too high for one of
    its layers can diverge the whole stack, where one too low for another only slows it."""
    return min(layers, key=lambda layer: float("inf") if layer.recipe.lr is None else layer.recipe.lr)


def _recommended(optim: OptimConfig, mixer: MixerConfig) -> OptimConfig:
    """The optim group with what it leaves null taken from the mixer's recipe (mixer.recipe.*)."""
    recipe = mixer.recipe
    if optim.lr is None and recipe.lr is None:
        raise ConfigError(f"optim.lr is null and mixer {mixer.name!r} recommends no rate (mixer.recipe.lr); set "
                          "optim.lr")
    weight_decay = optim.weight_decay if optim.weight_decay is not None else recipe.weight_decay
    try:
        return dataclasses.replace(optim, lr=optim.lr or recipe.lr, weight_decay=weight_decay or 0.0,
                                   decay_steps=optim.decay_steps or recipe.decay_steps)
    except ValueError as e:
        given = ", ".join(f"mixer.recipe.{k}={getattr(recipe, k)}" for k in ("decay_steps", "weight_decay", "lr")
                          if getattr(recipe, k) is not None)
        raise ConfigError(f"{e}; mixer={mixer.name} recommends {given}: set optim.* to train otherwise") from None


def _check_together(cfg: Config) -> None:
    """Constraints between groups."""
    try:
        cfg.mlp.check(cfg.model.width)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    pattern = cfg.model.mixers
    if len(pattern) > cfg.model.depth:
        raise ConfigError(f"model.mixers has {len(pattern)} entries but model.depth={cfg.model.depth}: every entry "
                          f"needs a layer; set model.depth to {len(pattern)} or more")
    examples = getattr(cfg.task, "train_examples", None)
    if examples is not None and examples < 1:
        raise ConfigError(f"task.train_examples={examples} must be at least 1 (or null: fresh examples every step)")
    positions = cfg.train.steps * cfg.train.batch_size
    if examples is not None and positions > MAX_POSITION + 1:
        raise ConfigError(f"task.train_examples: train.steps={cfg.train.steps} x train.batch_size="
                          f"{cfg.train.batch_size} reads {positions} stream positions of the fixed set, more than "
                          f"its int32 cursor counts ({MAX_POSITION + 1}): lower train.steps")
    vectors = cfg.task.input_kind == "vectors"
    if vectors and cfg.model.read_in == "identity" and cfg.model.width != cfg.task.token_dim:
        raise ConfigError(f"model.width={cfg.model.width} must equal the task's token size {cfg.task.token_dim} "
                          "with model.read_in=identity (or use model.read_in=learned)")
    # a hybrid's layers that do not apply them go without (a recurrent layer knows order from its recurrence)
    names = "+".join(dict.fromkeys(layer.name for layer in cfg.layers))
    if cfg.model.positions == "rope" and not any(layer.applies_rope for layer in cfg.layers):
        raise ConfigError(f"model.positions=rope: mixer {names!r} does not apply RoPE; use learned or none")
    rotary = "+".join(dict.fromkeys(layer.name for layer in cfg.layers if layer.needs_rope))
    if rotary and cfg.model.positions not in ("rope", "auto"):  # auto resolves to rope
        raise ConfigError(f"model.positions={cfg.model.positions}: mixer {rotary!r} rotates its keys by position "
                          "and has no form without RoPE; use model.positions=rope (or auto)")
    if cfg.model.positions == "shortformer" and not any(layer.takes_qk_positions for layer in cfg.layers):
        raise ConfigError(f"model.positions=shortformer: mixer {names!r} has no query and key inputs "
                          "to add positions to; use learned or none")
    uneven = isinstance(cfg.cluster.cpu_devices, int) and cfg.train.uneven(cfg.cluster.cpu_devices)
    if uneven:
        raise ConfigError(f"cluster.cpu_devices={cfg.cluster.cpu_devices}: {uneven}; give another count, or "
                          "cluster.cpu_devices=auto")


def register_bases() -> None:
    """Each group's defaults, written once in its dataclass, as the Hydra config its YAML files extend.

    The nodes are stored untyped (plain dicts): a typed structured config would
    have Hydra reject a bad value in its own multi-line error before `validate`
    can name it in one line. Row and MLP YAMLs say `defaults: [base_<module>, _self_]`
    and hold only what differs, so a composed config (the run's
    .hydra/config.yaml and its wandb config) still lists every field, and any
    field can be overridden without `++`.
    """
    store = ConfigStore.instance()

    def node(schema, **values):
        return {**plain(schema()), **values}

    for group, schemas in (("mixer", CONFIGS), ("mlp", MLP_CONFIGS)):
        for schema in set(schemas.values()):
            store.store(group=group, name=f"base_{schema.__module__.rsplit('.', 1)[-1]}", node=node(schema))
    for name, schema in TASKS.items():
        store.store(group="task", name=f"base_{name}", node={"name": name, **node(schema)})
    for group in ("model", "optim", "logger"):
        store.store(group=group, name="base", node=node(_FIXED[group]))
    store.store(group="cluster", name="base", node=node(ClusterConfig))
    store.store(name="base_train", node={"train": node(TrainConfig)})
    # eval.yaml's task overrides: their fields are the run's task's, known only once the run is read, so the
    # node takes any key (without the struct flag Hydra puts on the rest) and tmem.train.task_overrides checks
    # them; a YAML file cannot clear the flag, hence a stored node. Evaluations keep their compiled programs
    # where training does, by default
    evaluation = OmegaConf.create({"task": {}, "compilation_cache": ClusterConfig().compilation_cache})
    OmegaConf.set_struct(evaluation.task, False)
    store.store(name="base_eval", node=evaluation)


register_bases()

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
GROUPS = ("task", "model", "mixer", "mlp", "optim", "logger", "cluster", "experiment")
