"""Every train.py and eval.py command the docs show still composes and validates.

Commands are read from README.md, MEMORY.md and the guides in docs/: lines
of their code blocks (with `\\` continuations) and inline `python train.py
...` spans, after any environment assignments (`PYTHONPATH=tests python
train.py ...`: docs/add-a-memory.md's row is importable here, since pytest
puts tests/ on the path). A sweep
(`a=x,y` on the command line, or an experiment's hydra.sweeper.params) is
checked one value at a time, the other swept keys at their first value, so a
documented override that fits only some rows (`++mixer.output_gate=false`)
is caught on the row it does not fit. Placeholders such as `<run dir>` are
left out; nothing is trained.
"""

from __future__ import annotations

import functools
import re
import shlex

import pytest
from omegaconf import OmegaConf

from conftest import ROOT, compose_config, quick_only

DOCS = ("README.md", "MEMORY.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")))
ENV = r"(?:[A-Z_]+=\S+ )*"  # a command's environment assignments, left out
COMMAND = re.compile(ENV + r"python (train|eval)\.py\b")


def documented_commands() -> list[tuple[str, str]]:
    """(doc, command text) of every train.py and eval.py command, continuations joined."""
    found = []
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        inline = [m.group(1) for m in re.finditer(r"`(" + ENV + r"python (?:train|eval)\.py[^`]*)`", text)]
        # every fenced block, whatever its language, so a python block cannot pair one block's closing fence
        # with the next one's opening; only shell blocks hold commands
        blocks = [body for lang, body in re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S) if lang in ("", "bash", "sh")]
        lines = [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]
        found += [(doc, re.sub("^" + ENV, "", " ".join(c.split()))) for c in inline + lines if COMMAND.match(c.strip())]
    return found


def parse(command: str) -> tuple[str, bool, list[str]]:
    """The script, whether it is a multirun, and its overrides (placeholder arguments dropped)."""
    words = shlex.split(re.sub(r"<[^>]*>", "<>", command), comments=True)
    script = words[1].removesuffix(".py")
    multirun = bool({"-m", "--multirun"} & set(words))
    return script, multirun, [w for w in words[2:] if not w.startswith("-") and "<" not in w]


def _values(value: str) -> list[str]:
    """A sweep's values ("a,b" -> [a, b]); a list or a single value is one value."""
    return [value] if value.startswith("[") or "," not in value else value.split(",")


def jobs(script: str, multirun: bool, overrides: list[str]) -> list[list[str]]:
    """One override list per value of every swept key (the other swept keys at their first value); a seed's
    only at its first (a seed changes no field a check reads).

    The command line's sweeps replace the experiment's for the same key, as Hydra's sweeper does.
    """
    sweeps = {}
    if script == "train" and multirun:
        first = [f"{k}={_values(v)[0]}" if v else o for o in overrides for k, _, v in [o.partition("=")]]
        params = compose_config(first, with_hydra=True).hydra.sweeper.params
        sweeps = {k: _values(str(v)) for k, v in (params or {}).items()}
    fixed = []
    for o in overrides:
        key, _, value = o.partition("=")
        sweeps.pop(key, None)
        if len(_values(value)) > 1:
            sweeps[key] = _values(value)
        else:
            fixed.append(o)
    if "train.seed" in sweeps:
        sweeps["train.seed"] = sweeps["train.seed"][:1]
    base = fixed + [f"{k}={v[0]}" for k, v in sweeps.items()]
    out = [base] + [[*fixed, *(f"{k}={v if k == key else vs[0]}" for k, vs in sweeps.items())]
                    for key, values in sweeps.items() for v in values[1:]]
    return out


@functools.cache
def validated(job: tuple[str, ...]) -> None:
    """Compose and validate a train.py job once: commands in both docs share many jobs (a failure raises, and is
    not cached)."""
    from tmem.command import check_group_overrides
    from tmem.config import validate

    assert check_group_overrides(list(job)) is None, job
    validate(compose_config(job, with_hydra=True))


def command_id(case: tuple[str, str]) -> str:
    doc, command = case
    return f"{doc}:{command[:60]}"


COMMANDS = documented_commands()


def test_the_docs_show_commands():
    scripts = {parse(c)[0] for _, c in COMMANDS}
    assert scripts == {"train", "eval"} and len(COMMANDS) > 30


# the quick subset checks the README's and the guides' commands; MEMORY.md's experiment recipes (half the time) run
# in the full suite
@pytest.mark.parametrize("doc, command", quick_only(COMMANDS, {command_id(c) for c in COMMANDS if c[0] != "MEMORY.md"},
                                                    ids=command_id))
def test_documented_command_composes(doc, command):
    from tmem.probes import PROBES

    script, multirun, overrides = parse(command)
    for job in jobs(script, multirun, overrides):
        if script == "train":
            validated(tuple(job))
        else:
            probes = OmegaConf.to_container(compose_config(job, "eval", with_hydra=True).probes)
            assert probes and set(probes) <= set(PROBES), f"{command}: unknown probe in {probes}"
