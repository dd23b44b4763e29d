"""Data parallelism with JAX's own sharding: one mesh axis, `data`, over the devices a run uses.

The train state is replicated on every device. In a step each device draws
and differentiates only its own rows of every batch (`summed_over_devices`, a
`jax.shard_map`): rows of the one batch a single device would draw
(tasks.draw_rows), so a run's numbers do not depend on how many devices
trained it, up to the order of a float sum. The devices' sums
meet in one all-reduce per step. One is what data parallelism needs, and more
is a hazard on a CPU: there XLA runs independent collectives of a program in
any order, each device's thread blocking in the one it reached, so two
devices that reach two collectives in opposite orders wait on each other for
ever (MAD's compression job did, when XLA's own partitioner split its steps:
a loop's condition over the split batch and the loss's denominator were two).
No layer of tmem's own: a `jax.sharding.Mesh`, `NamedSharding`s, `jax.jit`
with in and out shardings, and `jax.shard_map` with one `psum`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

DATA = "data"  # the mesh's one axis: examples of a batch are split along it


def data_mesh(devices: Sequence[Any] | None = None) -> Mesh:
    """A one-axis mesh over `devices` (default every visible device).

    The axis is Auto (XLA propagates the shardings) rather than jax 0.12's
    default Explicit, under which every array's sharding is part of its type
    and the model's code would have to say how each op is sharded.
    """
    devices = jax.devices() if devices is None else list(devices)
    return jax.make_mesh((len(devices),), (DATA,), axis_types=(AxisType.Auto,), devices=devices)


def replicated(mesh: Mesh) -> NamedSharding:
    """A whole copy on every device: the train state's placement."""
    return NamedSharding(mesh, PartitionSpec())


def summed_over_devices(mesh: Mesh | None, local: Callable[..., Any]) -> Callable[..., Any]:
    """(*args) -> the sum over the devices of `local(*args, device, devices)`, in one all-reduce.

    Every device runs `local` on the same replicated `args` and its own index
    along `data`, so `local` picks its share of the work (tasks.draw_rows);
    a gradient it takes stays this device's own, and every output is summed
    by one `psum` of them all. With no mesh, or one device, it is
    `local(*args, 0, 1)`: the program one device always ran.

    JAX's check of which values vary over `data` is off: with it on, jax
    0.12 cannot trace the exact GELU (its erfc polynomial rejects a varying
    argument), and a gradient of a replicated argument would be summed over
    the devices where it is taken, one all-reduce per parameter.
    """
    if mesh is None or mesh.size == 1:
        return lambda *args: local(*args, 0, 1)

    def on_each(*args):
        return jax.lax.psum(local(*args, jax.lax.axis_index(DATA), mesh.size), DATA)

    return jax.shard_map(on_each, mesh=mesh, in_specs=PartitionSpec(), out_specs=PartitionSpec(), check_vma=False)


def check_divisible(devices: int, train) -> str | None:
    """One line when the batch of `train` (a TrainConfig) cannot be split into equal shares over the devices
    (TrainConfig.split: each device the same number of examples in each slice), else None."""
    uneven = train.uneven(devices)
    if uneven is None:
        return None
    return (f"{uneven} of the data mesh: change it, or limit the devices the run sees (CUDA_VISIBLE_DEVICES, "
            "JAX_PLATFORMS=cpu)")


def describe(mesh: Mesh, batch_size: int) -> str:
    """The console's one line naming the devices a run trains on and how the batch is split, so a user sees at
    once whether a run was really split, and whether a GPU install fell back to the CPU."""
    first, n = mesh.devices.flat[0], mesh.size
    kind = "" if first.device_kind == first.platform else f" ({first.device_kind})"  # a CPU's kind is "cpu"
    if n == 1:
        return f"training on 1 {first.platform} device{kind}: the whole batch of {batch_size} on it"
    processes = len({d.process_index for d in mesh.devices.flat})
    across = f" of {processes} processes" if processes > 1 else ""
    return (f"training on {n} {first.platform} devices{kind}{across}: each batch of {batch_size} split "
            f"{batch_size // n} per device on the data axis, the train state replicated")
