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
from tmem.schema import TrainConfig
from tmem.train.mesh import check_divisible, data_mesh, describe, summed_over_devices

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
from tasks import heldout, rows
from tmem.train.mesh import data_mesh, describe, replicated
from tmem.train.step import make_eval, make_train_step

tmp = Path(sys.argv[1])
cfg = validate(compose_config([*TINY, "model.depth=1", "train.microbatch=4"]))  # on two devices, two slices of 4 each
t = cfg.train
one, two = data_mesh(jax.devices()[:1]), data_mesh()
out = {"device_count": jax.device_count(), "describe": describe(two, t.batch_size)}
FAST = {"xla_backend_optimization_level": 0}


def collectives(compiled):
    text = compiled.as_text()
    return sum(text.count(f" {op}(") for op in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                                                 "collective-permute"))


def train(mesh, cfg=cfg, steps=3):
    t = cfg.train
    graphdef, state, tx, schedule = build(cfg)
    whole = replicated(mesh)
    step = jax.jit(make_train_step(graphdef, cfg.task, tx, t.batch_size, schedule, t.microbatch, mesh),
                   donate_argnums=0, in_shardings=whole, out_shardings=whole, compiler_options=FAST)
    state = jax.device_put(state, whole)
    compiled = step.lower(state).compile()
    losses = []
    for _ in range(steps):
        state, metrics = compiled(state)
        losses.append(float(metrics["loss"]))
    return state, losses, collectives(compiled)


def leaves(state):
    return [np.asarray(x) for x in jax.tree.leaves(state)]


def devices_of(state):
    return sorted({len(x.sharding.device_set) for x in jax.tree.leaves(state)})


state1, out["losses_1"], out["collectives_1"] = train(one)
state2, out["losses_2"], out["collectives_2"] = train(two)
out["max_param_diff"] = max(float(np.abs(a - b).max()) for a, b in zip(leaves(state1.params), leaves(state2.params)))
out["param_scale"] = max(float(np.abs(a).max()) for a in leaves(state1.params))
out["devices_1"], out["devices_2"] = devices_of(state1), devices_of(state2)

# a fixed training set, sampled in a loop whose length depends on the example (tasks/examples.py's cycle walk),
# no microbatch: once XLA's partitioner split that loop, its condition was a second all-reduce of the step
fixed = validate(compose_config([*TINY, "model.depth=1", "task.train_examples=32", "train.microbatch=null"]))
_, out["fixed_losses_1"], _ = train(one, fixed)
_, out["fixed_losses_2"], out["fixed_collectives_2"] = train(two, fixed)

# a hybrid stack, each layer its own row
hybrid = validate(compose_config([*TINY, "model.mixers=[gated_deltanet,softmax]", "train.microbatch=4"]))
_, out["hybrid_losses_1"], _ = train(one, hybrid)
_, out["hybrid_losses_2"], out["hybrid_collectives_2"] = train(two, hybrid)

# the held-out evaluation: each device 25 examples a pass (60 examples: on one device three passes, the last 10
# padded to 25; on two, two passes of 50, the last 10 padded to 50)
graphdef = build(cfg).graphdef
batch = jax.tree.map(lambda x: x[:60], heldout(cfg.task))
evaluated = {}
for name, mesh in (("1", one), ("2", two)):
    whole = replicated(mesh)
    args = jax.device_put((state1.params, state1.rest, batch), whole)
    evaluate = jax.jit(make_eval(graphdef, cfg.task, chunk=25, mesh=mesh), out_shardings=whole,
                       compiler_options=FAST).lower(*args).compile()
    evaluated[name] = {k: float(v) for k, v in evaluate(*args).items()}
    out[f"eval_collectives_{name}"] = collectives(evaluate)
out["eval_1"], out["eval_2"] = evaluated["1"], evaluated["2"]

# MAD's macro accuracy, not a mean over examples: over its test batches of 128 on either mesh (300 examples: two
# batches and one of 44), against each batch scored alone; batches of 50 (a pass of 100 on two devices) differ
mad = validate(compose_config(["task=mad_in_context_recall", "task.seq_len=16", "task.heldout_size=300",
                               "model.width=16", "model.depth=1", "mixer.heads=2", "logger=disabled"]))
built, batch = build(mad), heldout(mad.task)
for name, mesh in (("1", one), ("2", two)):
    whole = replicated(mesh)
    args = jax.device_put((built.state.params, built.state.rest, batch), whole)
    evaluate = jax.jit(make_eval(built.graphdef, mad.task, mesh=mesh), out_shardings=whole, compiler_options=FAST)
    out[f"mad_macro_{name}"] = float(evaluate(*args)["macro_accuracy"])
scores = jax.jit(lambda b: mad.task.loss(built.model(b.inputs, positions=b.positions), b)[1]["macro_accuracy"])
for size in (128, 50):
    parts = [rows(batch, start, min(size, 300 - start)) for start in range(0, 300, size)]
    w = np.array([float(b.mask.sum()) for b in parts])
    out[f"mad_macro_by_batches_of_{size}"] = float(w @ np.array([float(scores(b)) for b in parts]) / w.sum())

# saved under one layout, restored under the other
for saved, mesh, restored_on, name in ((state2, two, one, "2to1"), (state1, one, two, "1to2")):
    Checkpoints(tmp / name, mesh=mesh).save(saved)
    back = Checkpoints(tmp / name, mesh=restored_on).restore(jax.eval_shape(lambda: saved))
    out[f"restore_{name}_devices"] = devices_of(back)
    out[f"restore_{name}_equal"] = all(np.array_equal(a, b) for a, b in zip(leaves(saved), leaves(back)))
    out[f"restore_{name}_step"] = int(back.step)

# a batch slice the devices do not divide: one clear line, before anything is built or compiled
odd = validate(compose_config([*TINY, "train.batch_size=18", "train.microbatch=6"]))
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
    # the work really was split: the 2-device step sums its gradients across devices in one collective (two can
    # deadlock on a CPU, tmem/train/mesh.py), the 1-device one has none, and the state is replicated on every device
    assert out["collectives_1"] == 0 and out["collectives_2"] == 1
    np.testing.assert_allclose(out["fixed_losses_2"], out["fixed_losses_1"], rtol=1e-5)
    assert out["fixed_collectives_2"] == 1
    np.testing.assert_allclose(out["hybrid_losses_2"], out["hybrid_losses_1"], rtol=1e-5)
    assert out["hybrid_collectives_2"] == 1
    assert out["eval_2"].keys() == out["eval_1"].keys() and "loss" in out["eval_1"]
    for k, v in out["eval_1"].items():
        assert abs(out["eval_2"][k] - v) <= 1e-5 * max(1.0, abs(v)), k
    assert out["eval_collectives_1"] == 0 and out["eval_collectives_2"] == 1
    want = out["mad_macro_by_batches_of_128"]
    assert out["mad_macro_1"] == pytest.approx(want, rel=1e-5) and out["mad_macro_2"] == pytest.approx(want, rel=1e-5)
    assert abs(out["mad_macro_by_batches_of_50"] - want) > 1e-4  # so the grouping is what the test sees
    assert out["devices_1"] == [1] and out["devices_2"] == [2]
    assert out["describe"] == ("training on 2 cpu devices: each batch of 16 split 8 per device on the data axis, "
                               "the train state replicated")


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
        "train.microbatch=6 does not divide the 9 examples each of 2 devices gets of train.batch_size=18 of the data "
        "mesh: change it, or limit the devices the run sees (CUDA_VISIBLE_DEVICES, JAX_PLATFORMS=cpu)")
    assert two_devices["odd_wrote"] == []


def test_each_device_gets_equal_shares_of_each_slice():
    def check(devices, batch_size, microbatch):
        return check_divisible(devices, TrainConfig(batch_size=batch_size, microbatch=microbatch))

    def split(devices, batch_size, microbatch):
        return TrainConfig(batch_size=batch_size, microbatch=microbatch).split(devices)

    assert check(1, 15, None) is None and split(1, 15, None) == (1, 15)
    assert check(4, 64, 32) is None and split(4, 64, 32) == (1, 16)  # the microbatch caps a device's share
    assert split(1, 64, 16) == (4, 16) and split(2, 64, 16) == (2, 16)  # the same share on any number of devices
    assert "train.batch_size=30 " in check(4, 30, None)
    assert "train.batch_size=30 " in check(4, 30, 32)  # a microbatch above the batch is no slice
    assert "train.microbatch=8 " in check(4, 48, 8)  # 48 divides, its parts of 12 do not split into 8s


def test_one_device_places_nothing_and_names_its_mesh():
    mesh = data_mesh(jax.devices()[:1])
    assert mesh.axis_names == ("data",) and mesh.size == 1
    # the one-device program is the one it always was: no shard_map, the whole share
    assert summed_over_devices(mesh, lambda x, device, devices: (x, device, devices))(7) == (7, 0, 1)
    assert describe(mesh, 64) == "training on 1 cpu device: the whole batch of 64 on it"
