"""Data parallelism with JAX's own sharding: one mesh axis, `data`, over the devices a run uses.

The train state is replicated on every device and each batch is split along
`data` by its examples; XLA then inserts the one all-reduce of the gradients
that data parallelism needs. The batch is sampled exactly as on one device
(the same keys, the same microbatch slices) and only then placed, so a run's
numbers do not depend on how many devices trained it, up to the order of a
float sum. No layer of tmem's own: a `jax.sharding.Mesh`, `NamedSharding`s,
and `jax.jit` with in and out shardings.
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


def split_batch(mesh: Mesh) -> Callable[[Any], Any]:
    """batch -> the same batch placed split along `data` by its first axis, for use inside jit.

    Leaves whose first axis is not the batch's (none today; a task's `meta` may
    add some) stay replicated, and so does a batch the devices do not divide
    (an evaluation chunk; training batches are checked by `check_divisible`
    before anything compiles). On a one-device mesh this is the identity, so a
    single device compiles the program it always did.
    """
    if mesh.size == 1:
        return lambda batch: batch
    by_example = NamedSharding(mesh, PartitionSpec(DATA))

    def place(batch):
        n = batch.inputs.shape[0]
        if n % mesh.size:
            return batch
        return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, by_example)
                            if x.ndim and x.shape[0] == n else x, batch)

    return place


def check_divisible(devices: int, train) -> str | None:
    """One line when the batch (or each microbatch slice) of `train` (a TrainConfig) cannot be split evenly over
    the devices, else None.

    Every slice the step samples is split along `data` as a whole, so it is the
    slice (train.microbatch when it is below train.batch_size) that must divide.
    """
    name, size = train.slice_field
    if size % devices == 0:
        return None
    return (f"{name}={size} does not split evenly over the {devices} devices of the data mesh: choose a multiple "
            f"of {devices}, or limit the devices the run sees (CUDA_VISIBLE_DEVICES, JAX_PLATFORMS=cpu)")


def describe(mesh: Mesh, batch_size: int) -> str:
    """The console's one line naming the mesh, so a user can see whether a run was really split."""
    kind = mesh.devices.flat[0].platform
    n = mesh.size
    if n == 1:
        return f"mesh: 1 {kind} device (data axis of 1): the whole batch of {batch_size} on it"
    processes = len({d.process_index for d in mesh.devices.flat})
    across = f" of {processes} processes" if processes > 1 else ""
    return (f"mesh: {n} {kind} devices{across} on the data axis: each batch of {batch_size} split {batch_size // n} "
            "per device, the train state replicated")
