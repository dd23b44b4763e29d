"""Orbax checkpoints of the train state: exact round trip, steps, metadata, clear errors."""

import errno
import json
import logging
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from orbax.checkpoint import v1 as ocp

from conftest import ROOT, TINY, compose_config, quick_only
from tmem.config import validate
from tmem.model import build_model
from tmem.train.checkpoint import FINISHED, TMP_SUFFIX, CheckpointError, Checkpoints, Damaged, _orphaned_read
from tmem.train.optim import build_optimizer, learning_rate
from tmem.train.step import init_state, make_train_step


@pytest.fixture(scope="module")
def trained_state():
    """Made once for the file: every test reads it and none changes it, and a test that made its own paid for the
    step's trace and a compiled program's load again (about 0.8 s each)."""
    cfg = validate(compose_config(TINY))
    tx = build_optimizer(cfg.optim, 10)
    graphdef, state = init_state(build_model(cfg, cfg.task), tx, seed=7)
    step = jax.jit(make_train_step(graphdef, cfg.task, tx, 8, learning_rate(cfg.optim, 10)))
    for _ in range(3):
        state, _ = step(state)
    return state


def test_round_trip_restores_every_leaf_exactly(trained_state, tmp_path):
    ckpts = Checkpoints(tmp_path / "ck", config={"model": {"width": 16}})
    ckpts.save(trained_state, {"eval/accuracy": 0.5, "target_step": None})
    restored = Checkpoints(tmp_path / "ck").restore(jax.eval_shape(lambda: trained_state))
    assert int(restored.step) == 3
    leaves = jax.tree.leaves(jax.tree.map(np.asarray, trained_state))
    for a, b in zip(leaves, jax.tree.leaves(jax.tree.map(np.asarray, restored))):
        np.testing.assert_array_equal(a, b)
    assert ckpts.metrics(3) == {"eval/accuracy": 0.5, "target_step": None}
    assert ckpts.config() == {"model": {"width": 16}}


def test_restore_a_chosen_step_and_name_missing_ones(trained_state, tmp_path):
    ckpts = Checkpoints(tmp_path / "ck")
    ckpts.save(trained_state)
    later = trained_state.replace(step=trained_state.step + 5)
    ckpts.save(later)
    assert ckpts.steps() == [3, 8] and ckpts.latest_step() == 8
    assert int(ckpts.restore(jax.eval_shape(lambda: later), step=3).step) == 3
    with pytest.raises(CheckpointError, match=r"no checkpoint at step 4 .* have steps \[3, 8\]"):
        ckpts.restore(jax.eval_shape(lambda: later), step=4)


def test_empty_directory_is_a_clear_error(trained_state, tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint in"):
        Checkpoints(tmp_path / "empty").restore(jax.eval_shape(lambda: trained_state))


@pytest.fixture
def two_steps(trained_state, tmp_path):
    """A folder with steps 3 and 8, the abstract state that restores them, and step 3's arrays."""
    ckpts = Checkpoints(tmp_path / "ck", config={"model": {"width": 16}}, keep=None)
    ckpts.save(trained_state, {"eval/accuracy": 0.5})
    later = trained_state.replace(step=trained_state.step + 5)
    ckpts.save(later, {"eval/accuracy": 0.7})
    return tmp_path / "ck", jax.eval_shape(lambda: later), jax.device_get(trained_state)


def largest_data_file(step_dir):
    return max((p for p in (step_dir / "state").rglob("*") if p.is_file() and "/d/" in str(p)),
               key=lambda p: p.stat().st_size)


def flip_bytes(path, n=64):
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + n] = bytes(b ^ 0xFF for b in data[middle:middle + n])
    path.write_bytes(bytes(data))


# Damage to the latest step (8), each as a user or a failing disk could leave it.
DAMAGE = {
    "truncated data": lambda s: largest_data_file(s).write_bytes(largest_data_file(s).read_bytes()[:100]),
    "emptied data": lambda s: largest_data_file(s).write_bytes(b""),
    "deleted data": lambda s: largest_data_file(s).unlink(),
    "bit-flipped data": lambda s: flip_bytes(largest_data_file(s)),
    "deleted manifest": lambda s: (s / "state" / "manifest.ocdbt").unlink(),
    "emptied state metadata": lambda s: (s / "state" / "_METADATA").write_text(""),
    "emptied step metadata": lambda s: (s / FINISHED).write_text(""),
    "checksum changed": lambda s: (s / FINISHED).write_text(_edit_checksum(s / FINISHED)),
}


def _edit_checksum(path):
    meta = json.loads(path.read_text())
    first = next(iter(meta["custom_metadata"]["checksums"]))
    meta["custom_metadata"]["checksums"][first] = "0" * 64
    return json.dumps(meta)


# the quick subset damages the data, its checksum and the metadata once each; the full suite every way
@pytest.mark.parametrize("damage", quick_only(DAMAGE, {"bit-flipped data", "checksum changed", "emptied step metadata"}))
def test_damage_is_named_and_a_resume_falls_back_to_the_newest_intact_step(two_steps, damage, caplog):
    folder, abstract, step_3 = two_steps
    DAMAGE[damage](folder / "8")
    ckpts = Checkpoints(folder)
    with pytest.raises(Damaged, match=r"step 8 .*(damaged|cannot be verified).*the newest intact step is 3"):
        ckpts.restore(abstract, step=8)  # eval of that step: one line, never "does not fit this config"
    restored = ckpts.resume(abstract)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), step_3)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "resume" in r.getMessage()]
    assert len(warnings) == 1 and "step 8" in warnings[0] and "8.damaged" in warnings[0]
    assert ckpts.steps() == [3] and (folder / "8.damaged").is_dir()  # moved aside, not deleted
    ckpts.save(restored.replace(step=restored.step + 5))  # the run goes on and saves step 8 afresh
    assert ckpts.steps() == [3, 8] and int(ckpts.restore(abstract).step) == 8


def test_every_step_damaged_is_one_line(two_steps):
    folder, abstract, _ = two_steps
    for step in ("3", "8"):
        largest_data_file(folder / step).unlink()
    with pytest.raises(CheckpointError, match="no intact checkpoint in .* every step was damaged"):
        Checkpoints(folder).resume(abstract)


def test_a_state_of_another_shape_is_reported_as_a_config_change(two_steps):
    folder, abstract, _ = two_steps
    grown = abstract.replace(step=jax.ShapeDtypeStruct((2,), abstract.step.dtype))
    with pytest.raises(CheckpointError, match="does not fit this config") as raised:
        Checkpoints(folder).restore(grown, step=8)
    assert not isinstance(raised.value, Damaged)


def test_metrics_are_not_needed_to_restore_or_to_save(two_steps, caplog):
    folder, abstract, _ = two_steps
    (folder / "8" / FINISHED).write_text("")  # the file that holds a step's metrics (and checksums)
    ckpts = Checkpoints(folder)
    assert ckpts.metrics(8) == {} and "step 8's metrics are unknown" in caplog.text
    assert ckpts.metrics(3) == {"eval/accuracy": 0.5} and ckpts.config() == {"model": {"width": 16}}
    restored = ckpts.restore(abstract, step=3)
    ckpts.save(restored.replace(step=restored.step + 17))  # a damaged step does not stop a save
    assert ckpts.steps()[-1] == 20


def test_an_old_step_is_deleted_only_after_the_new_one_reads_back(trained_state, tmp_path, monkeypatch):
    ckpts = Checkpoints(tmp_path / "ck", keep=1)
    ckpts.save(trained_state)
    later = trained_state.replace(step=trained_state.step + 5)
    real_save = ocp.save_checkpointables

    def save_then_rot(path, checkpointables, **kwargs):  # the disk returns other bytes than were written
        real_save(path, checkpointables, **kwargs)
        flip_bytes(largest_data_file(Path(path)))

    monkeypatch.setattr(ocp, "save_checkpointables", save_then_rot)
    with pytest.raises(CheckpointError, match=r"step 8 was written but does not read back .* moved it to "
                                              r"8.damaged; the earlier steps \[3\] are kept"):
        ckpts.save(later)
    assert ckpts.steps() == [3]
    monkeypatch.setattr(ocp, "save_checkpointables", real_save)
    ckpts.save(later)  # a save that reads back replaces step 3
    assert ckpts.steps() == [8] and (tmp_path / "ck" / "8.damaged").is_dir()


def test_a_full_disk_keeps_the_previous_checkpoint_and_says_so(trained_state, tmp_path, monkeypatch):
    ckpts = Checkpoints(tmp_path / "ck", keep=1)
    ckpts.save(trained_state)
    real_save = ocp.save_checkpointables

    def full_disk(path, checkpointables, **kwargs):  # half the arrays written, then the device is full
        (Path(path).parent / f"{Path(path).name}{TMP_SUFFIX}-1").mkdir()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ocp, "save_checkpointables", full_disk)
    with pytest.raises(CheckpointError, match=r"cannot save step 8 .*: no space left on device; the earlier steps "
                                              r"\[3\] are intact. Free space, then continue with train.resume=true"):
        ckpts.save(trained_state.replace(step=trained_state.step + 5))
    monkeypatch.setattr(ocp, "save_checkpointables", real_save)
    assert ckpts.steps() == [3] and sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["3"]
    assert int(ckpts.restore(jax.eval_shape(lambda: trained_state)).step) == 3


def test_saving_a_step_again_keeps_one_copy(trained_state, tmp_path):
    ckpts = Checkpoints(tmp_path / "ck")
    ckpts.save(trained_state, {"eval/accuracy": 0.5})
    ckpts.save(trained_state, {"eval/accuracy": 0.5})  # the final save after a periodic one at the same step
    assert ckpts.steps() == [3] and not list((tmp_path / "ck").glob("*.damaged"))


KILLED_WHILE_SAVING = """
import os, signal, sys
import jax.numpy as jnp
from orbax.checkpoint._src.path import async_path
from tmem.train.checkpoint import Checkpoints
from tmem.train.step import TrainState

def state(step):
    return TrainState(step=jnp.int32(step), params={"w": jnp.arange(12.0) * step}, rest={}, opt_state=(),
                      key=jnp.zeros(2, jnp.uint32), nonfinite_step=jnp.int32(-1))

ckpts = Checkpoints(sys.argv[1], keep=1)
ckpts.save(state(3))
async def killed(*args, **kwargs):  # every file of the step is written; orbax is about to rename it into place
    os.kill(os.getpid(), signal.SIGKILL)
async_path.rename = killed
ckpts.save(state(8))
"""


def test_a_kill_while_a_checkpoint_is_written_loses_nothing(tmp_path):
    from tmem.train.step import TrainState

    done = subprocess.run([sys.executable, "-c", KILLED_WHILE_SAVING, str(tmp_path / "ck")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert [p.name for p in (tmp_path / "ck").iterdir() if p.name.startswith("8")]  # the half-written step
    ckpts = Checkpoints(tmp_path / "ck", keep=1)
    assert ckpts.steps() == [3]
    abstract = TrainState(step=jax.ShapeDtypeStruct((), np.int32), params={"w": jax.ShapeDtypeStruct((12,), np.float32)},
                          rest={}, opt_state=(), key=jax.ShapeDtypeStruct((2,), np.uint32),
                          nonfinite_step=jax.ShapeDtypeStruct((), np.int32))
    restored = ckpts.resume(abstract)
    np.testing.assert_array_equal(restored.params["w"], np.arange(12.0) * 3)
    ckpts.save(restored.replace(step=restored.step + 5))  # the next save clears what the killed one left
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["8"]


def test_a_step_saved_before_checksums_restores_unverified_with_its_metrics(trained_state, tmp_path, caplog):
    """Runs saved by orbax's training Checkpointer (tmem before checksums) stay readable, and say so."""
    old = ocp.training.Checkpointer(tmp_path / "ck")
    old.save(3, trained_state, metrics={"eval/accuracy": 0.5})
    old.close()
    ckpts = Checkpoints(tmp_path / "ck")
    restored = ckpts.restore(jax.eval_shape(lambda: trained_state))
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), jax.device_get(trained_state))
    assert "carries no checksums" in caplog.text and ckpts.metrics(3) == {"eval/accuracy": 0.5}


READ_AGAIN = r'''
import gc
import sys
sys.path.insert(0, {tests!r})
import jax
from conftest import TINY, compose_config
from tmem.config import validate
from tmem.model import build_model
from tmem.train.checkpoint import Checkpoints, Damaged
from tmem.train.optim import build_optimizer
from tmem.train.step import init_state

cfg = validate(compose_config(TINY))
state = init_state(build_model(cfg, cfg.task), build_optimizer(cfg.optim, 10), seed=7)[1]
ckpts = Checkpoints({folder!r}, keep=None)
ckpts.save(state.replace(step=state.step + 3))
ckpts.save(state.replace(step=state.step + 8))
data = max((p for p in (ckpts.directory / "8" / "state").rglob("*") if p.is_file() and "/d/" in str(p)),
           key=lambda p: p.stat().st_size)
data.write_bytes(data.read_bytes()[:100])
abstract = jax.eval_shape(lambda: state)
for _ in range({reads}):
    try:
        ckpts.restore(abstract, step=8)
    except Damaged:
        print("named", file=sys.stderr)
    gc.collect()  # what the garbage collector frees now reports now, not dozens of reads later
'''


@pytest.mark.parametrize("message, orphaned", [
    ("Task exception was never retrieved\nfuture: <Task finished coro=<_read_array() at /x/orbax/checkpoint/a.py:1>>",
     True),
    ("Future exception was never retrieved\nfuture: <Future finished exception=ValueError('OUT_OF_RANGE: Error "
     "reading shard entry in \"params.c/0/0\" in OCDBT database at local file \"/ck/8/state/\"')>", True),
    ("_GatheringFuture exception was never retrieved\nfuture: <_GatheringFuture finished exception=Exception("
     "\"Encountered error while reading array index. See full TensorStore details: ...\")>", True),
    ("Future exception was never retrieved\nfuture: <Future finished exception=ValueError('bad batch')>", False),
    ("Task was destroyed but it is pending!\ntask: <Task pending coro=<orbax_read()>>", False),
])
def test_only_orbax_reads_that_nobody_awaited_are_dropped_from_asyncio_log(message, orphaned):
    # the three forms asyncio logs after a damaged step's read; any other error of the event loop still prints
    assert _orphaned_read(message) is orphaned


@pytest.mark.slow  # about 9 s: the late errors come when the garbage collector frees orbax's pending reads, which
# left to itself took 68 failed reads the first time; collected after each read, 20 reads without the filters print
# hundreds of unraisable coroutines and a few tasks' and futures' "never retrieved"
def test_a_truncated_step_read_again_and_again_prints_only_its_one_line(tmp_path):
    code = READ_AGAIN.format(tests=str(ROOT / "tests"), folder=str(tmp_path / "ck"), reads=20)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stderr.splitlines() == ["named"] * 20, done.stderr[-3000:]
