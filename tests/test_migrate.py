"""Runs saved before a row's recipe and run were parts of their own restore, resume and are evaluated; an old
field name on a command line is refused in one line naming the new one.

tests/saved/ holds what the code before the split wrote (commit 7a35f0f, its header says how): the record of
the session's tiny run (conftest.tiny_run, the same command) and the mixer nodes a Gated DeltaNet run and a
hybrid saved. The oracle is today's code: a migrated node equals what today's command saves.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
from omegaconf import OmegaConf

from conftest import ROOT, TINY, compose_config
from my_memory import Decayed, DecayedConfig
from tmem.config import ConfigError, saved_form, validate, with_new_fields
from tmem.mixers import Row
from tmem.mixers.migrate import migrate, migrate_config
from tmem.train import rundir
from tmem.train.checkpoint import FINISHED

SAVED = ROOT / "tests" / "saved"
PLAIN = [o for o in TINY if o != "mixer.heads=2"]


def saved(name: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(SAVED / name))


def test_saved_mixer_nodes_migrate_to_what_todays_commands_save():
    old = saved("mixer_nodes_before_recipe_and_run.yaml")
    new = saved_form(compose_config([*PLAIN, "mixer=gated_deltanet", "mixer.heads=2", "mixer.run.chunk=8",
                                     "mixer.recipe.lr=3e-3", "mixer.recipe.microbatch=8"]))["mixer"]
    # (with the fields the row gained since at their defaults, as a resume reads it: the recipe's steps)
    assert with_new_fields({"mixer": migrate(old["gated_deltanet"])})["mixer"] == new
    assert migrate(new) == new  # today's names stay as they are
    hybrid = saved_form(compose_config([*PLAIN, "mixer=gated_deltanet", "mixer.run.chunk=8",
                                        "mixer.run.eval_form=null",
                                        "model.mixers=[gated_deltanet,{name:softmax,window:8,recipe:{microbatch:32}}]"]
                                       ))["model"]["mixers"]
    # (each entry with the fields its row gained since at their defaults, as a resume reads it; softmax's
    # microbatch was 32 then)
    assert with_new_fields(migrate_config({"model": {"mixers": old["hybrid"]}}))["model"]["mixers"] == hybrid


@dataclasses.dataclass(frozen=True)
class ChunkyConfig(DecayedConfig):
    chunk: int = 3  # a memory's own knob that shares an old name of the run part


CHUNKY = Row(ChunkyConfig, Decayed)


def test_a_rows_own_knob_under_an_old_name_stays_where_it_is():
    node = {"name": "decayed", "_row_": "test_migrate.CHUNKY", "chunk": 5, "lr": 0.1, "form": "recurrent"}
    assert migrate(node) == {"name": "decayed", "_row_": "test_migrate.CHUNKY", "chunk": 5, "recipe": {"lr": 0.1},
                             "run": {"form": "recurrent"}}


def test_an_old_name_in_a_hybrid_entry_is_one_line():
    with pytest.raises(ConfigError, match=r"^model.mixers\[1\].optim.decay_steps is now "
                                          r"model.mixers\[1\].recipe.decay_steps: a row's recipe"):
        validate(compose_config([*TINY, "model.mixers=[gated_deltanet,{name:softmax,optim:{decay_steps:9}}]"]))


@pytest.fixture(scope="module")
def old_run(tiny_run, tmp_path_factory):
    """The session's tiny run with the configs the code before the split saved for the same command: its record
    and every checkpoint's (the record resolved, as that code saved it)."""
    run = tmp_path_factory.mktemp("old_run") / "run"
    shutil.copytree(tiny_run, run)
    record = SAVED / "before_recipe_and_run.yaml"
    shutil.copy(record, run / ".hydra" / "config.yaml")
    resolved = OmegaConf.to_container(OmegaConf.load(record), resolve=True)
    for marker in run.glob(f"checkpoints/*/{FINISHED}"):
        metadata = json.loads(marker.read_text())
        metadata["custom_metadata"]["config"] = resolved
        marker.write_text(json.dumps(metadata))
    return run


@pytest.mark.slow  # reads the session's tiny run, which trains
def test_an_old_run_restores_as_the_same_run_and_is_evaluated(old_run, tiny_run, tmp_path):
    from tmem.schema import LoggerConfig
    from tmem.train.evaluate import evaluate
    from tmem.train.restore import saved_run

    assert saved("before_recipe_and_run.yaml")["mixer"]["lr"] == 0.01  # the fixture holds the old names
    # the record today's code wrote for the same command (fields added since the fixture was saved at their defaults),
    # but for softmax's recommended microbatch, 32 then
    today = OmegaConf.to_container(OmegaConf.load(tiny_run / ".hydra" / "config.yaml"))
    today["mixer"]["recipe"]["microbatch"] = 32
    assert with_new_fields(migrate_config(saved("before_recipe_and_run.yaml"))) == today
    old_cfg, new_cfg = saved_run(old_run)[0], saved_run(tiny_run)[0]
    recipe = dataclasses.replace(new_cfg.mixer.recipe, microbatch=32)
    assert old_cfg == dataclasses.replace(new_cfg, mixer=dataclasses.replace(new_cfg.mixer, recipe=recipe),
                                          train=dataclasses.replace(new_cfg.train, microbatch=32))
    report = evaluate(str(old_run), ["heldout"], out_dir=tmp_path, logger=LoggerConfig(mode="disabled"))
    summary = json.loads((tiny_run / "summary.json").read_text())
    assert report["heldout"]["accuracy"] == pytest.approx(summary["eval/accuracy"], abs=1e-6)


@pytest.mark.slow  # reads the session's tiny run, which trains
def test_an_old_run_resumes_under_todays_names(old_run):
    """The resume's check against the saved config, the one place a resume reads it (the loop restores the
    state): today's names pass, a changed recipe is refused, by its new name."""
    args = [*TINY, "train.steps=40", "optim.decay_steps=30", "train.keep_checkpoints=null", "train.early_stop=false",
            "train.resume=true"]
    pinned = rundir.prepare([*args, f"hydra.run.dir={old_run}"])
    assert f"hydra.run.dir={old_run}" in pinned
    rundir.check_resume(old_run, saved_form(compose_config([*args, "mixer.run.implementation=plain"])))
    with pytest.raises(ConfigError, match=r"changes mixer.recipe.lr \(0.01 -> 0.003\)"):
        rundir.check_resume(old_run, saved_form(compose_config([*args, "mixer.recipe.lr=3e-3"])))
