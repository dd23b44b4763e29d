"""Generated commands: every field of every group, drawn valid and invalid, validates or is refused in one line.

Hypothesis draws a train.py command line from the typed schemas: a task, a
row and an MLP (or an option that does not exist), and a few overrides of any
field of the chosen task, row and fixed groups (a nested one, mixer.recipe's,
too), each a value of its type or zero, negative, huge, of another type, an
unknown choice or null, plus fields that do not exist. Each command goes
through `tmem.train.rundir.prepare`, the path train.py takes before Hydra
writes anything: it must either validate (and claim a directory that
`release` gives back as it was) or raise one ConfigError line naming a
field, leaving nothing behind. A few drawn commands run as `python train.py`:
a valid one trains its two steps, an invalid one exits non-zero with one line
on stderr, no traceback and no file.

The draws are derandomised, so the suite is reproducible; every command a draw
once found failing is kept as an `@example`.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import run_entry
from tasks import TASKS
from tmem.config import CONFIG_DIR, INT32_MAX, ConfigError
from tmem.mixers import CONFIGS
from tmem.schema import ClusterConfig, LoggerConfig, MLPConfig, ModelConfig, OptimConfig, TrainConfig
from tmem.train import rundir

FIXED = {"model": ModelConfig, "mlp": MLPConfig, "optim": OptimConfig, "logger": LoggerConfig, "train": TrainConfig,
         "cluster": ClusterConfig}
OPTIONS = {group: sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml")) for group in ("task", "mixer", "mlp")}
# small enough that a drawn command that validates trains its two steps in seconds
BASE = {"model.width": "16", "model.depth": "1", "train.steps": "2", "train.batch_size": "8", "train.log_every": "1",
        "train.eval_every": "2", "train.checkpoint_every": "2", "logger": "disabled"}
# values any field may be given: zero, negative, huge, past int32, a fraction, another type, null, a list
ANY = ["0", "-1", "-0.5", "1000000000000", "3000000000", "0.5", "abc", "true", "null", "[1,2]"]
TYPED = {"int": ["1", "2", "3", "4", "8", "16", "64"], "float": ["0.0", "0.1", "1.0", "2.0", "1e-3"],
         "bool": ["true", "false"], "str": ["none", "auto", "plain"]}
GROUP = re.compile(r"\b(task|mixer|model|mlp|optim|logger|train|cluster|experiment|name|hydra\.\w+)[.=:]")
# kept out of the commands that run: a real rendezvous, the network, a compilation cache in the repository
RUN_ONLY_HERE = ("cluster.", "logger.mode", "logger=")


def fields(schema, prefix: str) -> list[tuple[str, str, object]]:
    """(key, type, default) of each field of a schema, a nested dataclass's fields under its own prefix."""
    out = []
    for f in dataclasses.fields(schema):
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            out += fields(type(default), f"{prefix}{f.name}.")
        else:
            out.append((f"{prefix}{f.name}", str(f.type), default))
    return out


# every integer field of every schema: a value past int32 must be refused
INT_FIELDS = {key for schemas in (FIXED.items(), [("task", t) for t in TASKS.values()],
                                  [("mixer", m) for m in CONFIGS.values()])
              for group, schema in schemas for key, kind, _ in fields(schema, f"{group}.")
              if "int" in kind and "float" not in kind}


def values(kind: str, default, good_only: bool = False) -> st.SearchStrategy[str]:
    """A field's default, values of its type, and (unless `good_only`) values of any kind."""
    own = [] if default is None or isinstance(default, tuple) else [str(default).lower() if isinstance(default, bool)
                                                                     else str(default)]
    typed = [v for name, vs in TYPED.items() if name in kind for v in vs]
    return st.sampled_from(own + typed + ([] if good_only else ANY))


@st.composite
def commands(draw, good_only: bool = False) -> list[str]:
    """A train.py command line: choices of task, row and MLP, and overrides of their fields (up to three; with
    `good_only`, one value of the field's type, among the fields a command that runs here may change)."""
    chosen = {group: draw(st.sampled_from(([] if good_only else [f"{options[0]}x"]) + options * 4))
              for group, options in OPTIONS.items()}  # now and then an option that does not exist
    keys = [k for group, schema in FIXED.items() for k in fields(schema, f"{group}.")]
    task = TASKS.get(chosen["task"])
    if task is not None:
        keys += fields(task, "task.")
    if chosen["mixer"] in CONFIGS:
        keys += fields(CONFIGS[chosen["mixer"]], "mixer.")
    if good_only:
        keys = [k for k in keys if not k[0].startswith(RUN_ONLY_HERE)]
    else:
        keys += [("model.nothing", "int", None), ("task.nothing", "int", None), ("mixer.nothing", "int", None)]
    picked = draw(st.lists(st.sampled_from(keys), max_size=1 if good_only else 3, unique_by=lambda k: k[0]))
    overrides = {key: draw(values(kind, default, good_only)) for key, kind, default in picked}
    small = {"task.heldout_size": "16"} if task is not None and "heldout_size" in {
        f.name for f in dataclasses.fields(task)} else {}
    return [f"{k}={v}" for k, v in {**chosen, **BASE, **small, **overrides}.items()]


def refused_or_given_back(args: list[str], run: Path) -> str | None:
    """None when the command validates (its claim given back, the directory as it was), else its one line.

    A command with an integer past int32 must be refused: it would fail, or wrap around, on the device.
    """
    try:
        rundir.prepare([*args, f"hydra.run.dir={run}"])
    except ConfigError as e:
        line = str(e)
        assert "\n" not in line and GROUP.search(line), line  # one line, naming a field or a group
        assert not run.exists(), args
        return line
    rundir.release(run)
    assert not run.exists(), args
    huge = [a for a in args if a.split("=")[0] in INT_FIELDS and re.fullmatch(r"[\w.]+=-?\d+", a)
            and abs(int(a.split("=")[1])) > INT32_MAX]
    assert not huge, args
    return None


def command(*overrides: str) -> list[str]:
    """A command as `commands` draws it: MQAR, softmax, no MLP, the small base, these overrides."""
    return [f"{k}={v}" for k, v in {"task": "mqar", "mixer": "softmax", "mlp": "none", **BASE,
                                    "task.heldout_size": "16", **dict(o.split("=", 1) for o in overrides)}.items()]


@pytest.fixture(scope="module")
def scratch():
    folder = Path(tempfile.mkdtemp(prefix="tmem-generated-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def drawn(examples: int) -> settings:
    """Reproducible draws: derandomised, no example database, no deadline (a compose takes 0.1-0.3 s)."""
    return settings(max_examples=examples, derandomize=True, database=None, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@drawn(15)
@given(args=commands())
# what draws found: integers past int32 accepted, then failing inside the jitted step (as task.train_examples did)
@example(args=command("task.vocab=3000000000"))
@example(args=command("task.train_examples=3000000000"))
@example(args=command("mixer.heads=1000000000000"))
@example(args=command("cluster.timeout=1000000000000"))
@example(args=command("mixer=mamba2", "mixer.recipe.decay_steps=3000000000"))
def test_a_drawn_command_validates_or_is_refused_in_one_line(scratch, args):
    refused_or_given_back(args, scratch / "run")


@pytest.mark.slow  # about 25 s
@drawn(60)
@given(args=commands())
def test_many_drawn_commands_validate_or_are_refused_in_one_line(scratch, args):
    refused_or_given_back(args, scratch / "run")


def runs_as_checked(args: list[str], run: Path) -> None:
    """`python train.py` with a drawn command: trains where `prepare` accepted it, else exits with its one line."""
    line = refused_or_given_back(args, run)
    done = run_entry("train.py", *args, f"hydra.run.dir={run}", timeout=600)
    if line is None:  # trained: to its end, or to a divergence its summary records (an error line, no traceback)
        assert (run / "summary.json").is_file() and "Traceback" not in done.stderr, (args, done.stderr[-3000:])
        shutil.rmtree(run)
    else:
        assert done.returncode != 0 and done.stderr.strip().splitlines() == [f"config error: {line}"], done.stderr
        assert not run.exists()


@pytest.mark.slow  # about 40 s in all: each command is a train.py process
@pytest.mark.parametrize("good_only, examples", [(True, 1), (False, 2)], ids=["values of their types", "any values"])
def test_drawn_commands_run_as_checked(scratch, good_only, examples):
    """The first draw is the simplest: a command that trains, and (unknown choices drawn first) one refused."""
    @drawn(examples)
    @given(args=commands(good_only))
    def check(args):
        runs_as_checked(args, scratch / "run")

    check()
