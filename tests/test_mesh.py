"""Data parallelism: 2 simulated CPU devices train as one does, and checkpoints cross device layouts.

The device count is fixed when jax starts, so the 2-device checks run in one
subprocess of their own (XLA_FLAGS set in its environment, before it imports
jax) and report what they measured as JSON; the tests below judge it.
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from conftest import ROOT
from tmem.config import TrainConfig
from tmem.train.mesh import check_divisible, data_mesh, describe, split_batch

TWO_DEVICES = r"""
import json, sys
from pathlib import Path

sys.path.insert(0, "tests")
import jax
import numpy as np
from conftest import TINY, compose_config
from tmem.config import ConfigError, validate
from tmem.train.build import build
from tmem.train.checkpoint import Checkpoints
from tmem.train.loop import Trainer
from tmem.train.mesh import data_mesh, describe, replicated, split_batch
from tmem.train.step import make_train_step

tmp = Path(sys.argv[1])
cfg = validate(compose_config([*TINY, "model.depth=1", "train.microbatch=8"]))  # two slices of 8, each split 4 and 4
t = cfg.train
one, two = data_mesh(jax.devices()[:1]), data_mesh()
out = {"device_count": jax.device_count(), "describe": describe(two, t.batch_size)}


def train(mesh, steps=3):
    graphdef, state, tx, schedule = build(cfg)
    whole = replicated(mesh)
    step = jax.jit(make_train_step(graphdef, cfg.task, tx, t.batch_size, schedule, t.microbatch, split_batch(mesh)),
                   donate_argnums=0, in_shardings=whole, out_shardings=whole,
                   compiler_options={"xla_backend_optimization_level": 0})
    state = jax.device_put(state, whole)
    compiled = step.lower(state).compile()
    losses = []
    for _ in range(steps):
        state, metrics = compiled(state)
        losses.append(float(metrics["loss"]))
    return state, losses, compiled.as_text().count("all-reduce(")


def leaves(state):
    return [np.asarray(x) for x in jax.tree.leaves(state)]


def devices_of(state):
    return sorted({len(x.sharding.device_set) for x in jax.tree.leaves(state)})


state1, out["losses_1"], out["all_reduce_1"] = train(one)
state2, out["losses_2"], out["all_reduce_2"] = train(two)
out["max_param_diff"] = max(float(np.abs(a - b).max()) for a, b in zip(leaves(state1.params), leaves(state2.params)))
out["param_scale"] = max(float(np.abs(a).max()) for a in leaves(state1.params))
out["devices_1"], out["devices_2"] = devices_of(state1), devices_of(state2)

# saved under one layout, restored under the other
for saved, mesh, restored_on, name in ((state2, two, one, "2to1"), (state1, one, two, "1to2")):
    Checkpoints(tmp / name, mesh=mesh).save(saved)
    back = Checkpoints(tmp / name, mesh=restored_on).restore(jax.eval_shape(lambda: saved))
    out[f"restore_{name}_devices"] = devices_of(back)
    out[f"restore_{name}_equal"] = all(np.array_equal(a, b) for a, b in zip(leaves(saved), leaves(back)))
    out[f"restore_{name}_step"] = int(back.step)

# a batch slice the devices do not divide: one clear line, before anything is built or compiled
odd = validate(compose_config([*TINY, "train.batch_size=18", "train.microbatch=9"]))
try:
    Trainer(odd, tmp / "odd", {})
except ConfigError as e:
    out["odd_error"] = str(e)
out["odd_wrote"] = sorted(p.name for p in (tmp / "odd").glob("*")) if (tmp / "odd").exists() else []
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def two_devices(tmp_path_factory):
    """What the 2-device subprocess measured (one process for every check that needs two devices)."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2".strip()
    done = subprocess.run([sys.executable, "-c", TWO_DEVICES, str(tmp_path_factory.mktemp("two_devices"))], cwd=ROOT,
                          env={**os.environ, "XLA_FLAGS": flags}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # one subprocess of its own with 2 devices, shared by these three
def test_two_devices_train_as_one(two_devices):
    out = two_devices
    assert out["device_count"] == 2
    np.testing.assert_allclose(out["losses_2"], out["losses_1"], rtol=1e-5)
    assert out["max_param_diff"] <= 1e-5 * out["param_scale"]
    # the work really was split: the 2-device step sums its gradients across devices, the 1-device one has no
    # collective, and the state is replicated on every device of its mesh
    assert out["all_reduce_1"] == 0 and out["all_reduce_2"] >= 1
    assert out["devices_1"] == [1] and out["devices_2"] == [2]
    assert out["describe"] == ("mesh: 2 cpu devices on the data axis: each batch of 16 split 8 per device, the train "
                               "state replicated")


@pytest.mark.slow  # one subprocess of its own with 2 devices, shared by these three
def test_checkpoints_restore_under_another_device_layout(two_devices):
    out = two_devices
    for name, devices in (("2to1", [1]), ("1to2", [2])):
        assert out[f"restore_{name}_step"] == 3
        assert out[f"restore_{name}_equal"], name
        assert out[f"restore_{name}_devices"] == devices, name


@pytest.mark.slow  # one subprocess of its own with 2 devices, shared by these three
def test_a_batch_the_devices_do_not_divide_is_one_line_before_anything_is_built(two_devices):
    assert two_devices["odd_error"] == (
        "train.microbatch=9 does not split evenly over the 2 devices of the data mesh: choose a multiple of 2, or "
        "limit the devices the run sees (CUDA_VISIBLE_DEVICES, JAX_PLATFORMS=cpu)")
    assert two_devices["odd_wrote"] == []


def test_divisibility_is_checked_on_the_slice_that_is_split():
    def check(devices, batch_size, microbatch):
        return check_divisible(devices, TrainConfig(batch_size=batch_size, microbatch=microbatch))

    assert check(1, 15, None) is None
    assert check(4, 64, 32) is None
    assert "train.batch_size=30 " in check(4, 30, None)
    assert "train.batch_size=30 " in check(4, 30, 32)  # a microbatch above the batch is no slice
    assert "train.microbatch=6 " in check(4, 48, 6)  # 48 divides, its slices of 6 do not


def test_one_device_places_nothing_and_names_its_mesh():
    mesh = data_mesh(jax.devices()[:1])
    assert mesh.axis_names == ("data",) and mesh.size == 1
    batch = object()
    assert split_batch(mesh)(batch) is batch  # the one-device program is the one it always was
    assert describe(mesh, 64) == "mesh: 1 cpu device (data axis of 1): the whole batch of 64 on it"
