"""The command line as Hydra will read it, checked before Hydra writes anything.

train.py and eval.py refuse a bad command in one line before Hydra creates
a run directory (tmem.train.rundir, eval.py's check_command): these parse the
overrides with Hydra's own parser and compose the config Hydra would, with
its errors in one line.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from tmem.config import CONFIG_DIR, GROUPS, ConfigError
from tmem.mixers.migrate import renamed


def overrides_of(args: list[str]) -> list[tuple[str, list]]:
    """(key, values) of each command-line override, parsed by Hydra's own parser (flags such as -m left out).

    A sweep gives each of its values; a deletion or null gives none. A line the
    parser refuses gives nothing here, and Hydra reports it when it composes.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides([a for a in args if not a.startswith("-")])
    except HydraException:
        return []
    out = []
    for o in parsed:
        values = [] if o.is_delete() else list(o.sweep_iterator()) if o.is_sweep_override() else [o.value()]
        out.append((o.key_or_group, [v for v in values if v is not None]))
    return out


def check_group_overrides(overrides: list[str], config_dir: Path = CONFIG_DIR) -> str | None:
    """One line for a command-line `group=option` naming no file in configs/ or a directory the command adds to
    Hydra's search path (`hydra.searchpath=[file://DIR]`), else None.

    Hydra would report this too, over several lines; checking first gives the
    one-line message every other config error gets.
    """
    parsed = overrides_of(overrides)
    searched = [config_dir]
    for key, values in parsed:
        if key == "hydra.searchpath":  # a researcher's own config directories, after tmem's (Hydra's order)
            paths = [str(p) for v in values for p in (v if isinstance(v, list) else [v])]
            if any(not p.startswith("file://") for p in paths):
                return None  # a package's configs: Hydra finds them, and reports a missing option itself
            searched += [Path(p.removeprefix("file://")) for p in paths]
    for key, values in parsed:
        if key not in GROUPS:
            continue
        options = sorted({p.stem for d in searched for p in (d / key).glob("*.yaml")})
        for option in values:
            if str(option) not in options:
                return f"{key}={option}: no such option; allowed: {', '.join(options)}"
    return None


def compose_command(args: list[str], config_name: str = "train", config_dir: Path = CONFIG_DIR,
                    sweeps: bool = True) -> DictConfig:
    """The config Hydra will compose from a command line, its own `hydra` section included.

    For checks that must run before Hydra writes anything. A sweep's overrides
    are left out unless `sweeps` (Hydra's compose cannot take them); Hydra's
    errors become one ConfigError line.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    lines = [a for a in args if not a.startswith("-")]
    try:
        if not sweeps:
            lines = [o.input_line for o in OverridesParser.create().parse_overrides(lines) if not o.is_sweep_override()]
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3", job_name=config_name):
            composed = compose(config_name, overrides=lines, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as e:  # Hydra's message in one line, its object dumps left out
        old = _old_name(args, {})
        if old:
            raise ConfigError(old) from None
        kept = [line.strip() for line in str(e).splitlines()
                if line.strip() and not line.lstrip().startswith(("full_key", "object_type", "reference_type", "See "))]
        unparsed = [line for line in lines if not _parses(line)]
        where = f"{unparsed[0]}: " if unparsed else ""
        raise ConfigError(f"{where}{' '.join(kept)} (see the override grammar: key=value, +key=value to add a "
                          "field)") from None
    old = _old_name(args, composed.get("mixer") or {})
    if old:
        raise ConfigError(old)
    return composed


def _old_name(args: list[str], mixer) -> str | None:
    """One line for an override of a mixer field under its name from before the row's recipe and run were parts
    of their own (`mixer.lr`, `mixer.form`), sweeps included, which the composed mixer group has no field of."""
    for key, _ in overrides_of(args):
        if key.startswith("mixer."):
            problem = renamed(key.removeprefix("mixer."), "mixer", mixer)
            if problem:
                return problem
    return None


def _parses(line: str) -> bool:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        OverridesParser.create().parse_overrides([line])
        return True
    except HydraException:
        return False
