"""The pure train step and the held-out evaluation, both jitted once per run."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from tasks import Batch, Cursor, draw, draw_rows, rows
from tmem.mlps import with_auxiliary_losses
from tmem.schema import split_batch
from tmem.train.mesh import summed_over_devices


@struct.dataclass
class TrainState:
    """Everything a run needs to continue exactly: what a checkpoint holds."""

    step: jax.Array  # int32: steps done
    params: Any  # nnx.State of the model's Params
    rest: Any  # the model's other variables (none for most models)
    opt_state: Any
    key: jax.Array  # uint32 key data of the run's base key; batches fold in the step
    nonfinite_step: jax.Array  # int32: first step whose loss was NaN/Inf, -1 if none


def init_state(model: nnx.Module, tx: optax.GradientTransformation, seed: int):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    # every array strongly typed, as the step returns it: a weakly typed initial value (jnp.full(shape, 0.5))
    # would make the step's second call a new program, compiled again (mesa's, Titans' and RWKV-7's did: 5 to
    # 14 s of a run to 0.99)
    params, rest = jax.tree.map(lambda x: jnp.asarray(x, x.dtype) if getattr(x, "weak_type", False) else x,
                                (params, rest))
    state = TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        rest=rest,
        opt_state=tx.init(params),
        key=jax.random.key_data(jax.random.key(seed)),
        nonfinite_step=jnp.full((), -1, jnp.int32),
    )
    return graphdef, state


def batch_key(state: TrainState) -> jax.Array:
    """The key of this step's batch: a function of (seed, step) only, so resuming is exact."""
    return jax.random.fold_in(jax.random.wrap_key_data(state.key), state.step)


def make_loss(graphdef, task, compute_dtype: str = "float32"):
    """(params, rest, batch) -> (loss, metrics). With compute_dtype bfloat16 the floating parameters are cast for
    the forward pass (so activations and matmuls run in bfloat16, and the gradients reach the float32 parameters
    through the cast) and the loss reads the outputs in float32.

    The loss differentiated is the task's plus the auxiliary losses its layers sow (the mixture of experts'
    load balancing, tmem.mlps.base), each reported as a metric of its own; the `loss` metric stays the task's."""
    dtype = jnp.dtype(compute_dtype)

    def loss_fn(params, rest, batch: Batch):
        if dtype != jnp.float32:
            params = jax.tree.map(lambda p: p.astype(dtype) if jnp.issubdtype(p.dtype, jnp.floating) else p, params)
        model = nnx.merge(graphdef, params, rest)
        if dtype != jnp.float32:
            computing_in(model, dtype)
        outputs, auxiliary, sown = with_auxiliary_losses(forward, model)(batch)
        loss, metrics = task.loss(outputs.astype(jnp.float32), batch)
        return (loss, metrics) if auxiliary is None else (loss + auxiliary, {**metrics, **sown})

    return loss_fn


def forward(model, batch: Batch):
    return model(batch.inputs, positions=batch.positions)


def computing_in(model: nnx.Module, dtype) -> None:
    """Make Flax's own layers compute in `dtype`: with `dtype=None` an nnx.Linear, Embed or norm computes in its
    `param_dtype` (float32), casting a bfloat16 parameter back up. tmem's own layers compute in the dtype of the
    parameters they are handed."""
    for _, module in nnx.iter_graph(model):
        if isinstance(module, nnx.Module) and hasattr(module, "param_dtype") and hasattr(module, "dtype"):
            module.dtype = dtype


def make_gradients(graphdef, task, batch_size: int, microbatch: int | None = None, mesh=None,
                   compute_dtype: str = "float32"):
    """(params, rest, key) -> (metrics, grads) of one freshly sampled batch.

    With a `microbatch` below a device's part of the batch, each device
    differentiates its part in slices of that many examples, one after
    another (tmem.schema.split_batch), and the results are combined weighted
    by each slice's scored positions: the gradient of the whole batch, but one
    slice's activations stay in cache, which on a CPU makes a 64-example step
    cost about two 32-example ones rather than three. `key` may instead be a
    tasks.Cursor: the batch is then the next examples of the task's fixed
    training set (task.train_examples, tasks/examples.py).

    On a `mesh` of several devices (tmem.train.mesh) each device draws and
    differentiates its own rows of every slice (tasks.draw_rows: the batch is
    the same whatever the devices and the microbatch), weighted the same way,
    and the devices' sums meet in one all-reduce.
    """
    grad_fn = jax.value_and_grad(make_loss(graphdef, task, compute_dtype), has_aux=True)
    devices = 1 if mesh is None else mesh.size
    slices, share = split_batch(batch_size, microbatch, devices)
    if slices == devices == 1:
        def whole(params, rest, key):
            (_, metrics), grads = grad_fn(params, rest, draw(task, key, batch_size))
            return metrics, grads
        return whole

    def weighted(params, rest, key, device, devices):
        def one(start):
            batch = draw_rows(task, key, batch_size, start + device * share, share)
            (_, metrics), grads = grad_fn(params, rest, batch)
            return scored(batch, (metrics, grads))

        return one(0) if slices == 1 else summed_map(one, share * devices * jnp.arange(slices))

    return mean_over_devices(mesh, weighted)


def scored(batch: Batch, values):
    """(w, w * values) with w the batch's scored positions: what slices, chunks and devices add up, so that their
    sum divided by the summed w is the mean over the whole batch."""
    w = batch.mask.sum()
    return w, jax.tree.map(lambda x: w * x, values)


def summed_map(f, xs):
    """The sum over the leading axis of `lax.map(f, xs)`: slices or chunks one after another, added up."""
    return jax.tree.map(lambda x: x.sum(0), jax.lax.map(f, xs))


def mean_over_devices(mesh, weighted):
    """(*args) -> the scored-position mean of what `weighted(*args, device, devices)` adds up on each device (a
    `scored` pair): the devices' pairs summed in one all-reduce (tmem.train.mesh), then divided once."""
    summed = summed_over_devices(mesh, weighted)

    def mean(*args):
        w, sums = summed(*args)
        return jax.tree.map(lambda x: x / jnp.maximum(w, 1.0), sums)

    return mean


def make_train_step(graphdef, task, tx: optax.GradientTransformation, batch_size: int, lr_schedule,
                    microbatch: int | None = None, mesh=None, compute_dtype: str = "float32"):
    """(state) -> (state, metrics): sample on device, forward, backward, update.

    On a `mesh` of several devices each differentiates its share of the batch (see make_gradients).
    """
    gradients = make_gradients(graphdef, task, batch_size, microbatch, mesh, compute_dtype)

    def train_step(state: TrainState):
        fixed = getattr(task, "train_examples", None) is not None  # the step's examples of the fixed set
        source = Cursor(state.key, state.step * batch_size) if fixed else batch_key(state)
        metrics, grads = gradients(state.params, state.rest, source)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        bad = ~jnp.isfinite(metrics["loss"]) & (state.nonfinite_step < 0)
        metrics = dict(metrics, grad_norm=optax.tree.norm(grads), lr=lr_schedule(state.step))
        new = state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                            nonfinite_step=jnp.where(bad, state.step, state.nonfinite_step))
        return new, metrics

    return train_step


def chance_loss(graphdef, task, params, rest, batch: Batch) -> float:
    """The loss on `batch` of a model that has learned nothing: all-zero outputs.

    Zero logits are the uniform guess (log V for V classes), a zero prediction
    the mean-free regressor; a loss far above this is a model that diverged.
    """
    out = jax.eval_shape(lambda: nnx.merge(graphdef, params, rest)(batch.inputs, positions=batch.positions))
    return float(task.loss(jnp.zeros(out.shape, out.dtype), batch)[0])


# Held-out examples a device evaluates per pass, by platform. On the 2-core CPU's two devices, passes of 8 took
# 0.75 to 0.99 of the time passes of 50 did, row by row (benchmarks/eval_chunk.py, BENCHMARKS.md): a smaller pass's
# activations stay in cache.
# An accelerator keeps the chunk of 100 a single device had before (not measured: no device was lent).
CPU_EVAL_CHUNK, ACCELERATOR_EVAL_CHUNK = 8, 100


def make_eval(graphdef, task, chunk: int | None = None, mesh=None, compute_dtype: str = "float32"):
    """(params, rest, batch) -> mask-weighted mean metrics over a large batch, in chunks.

    Each device evaluates `chunk` examples per pass (default: CPU_EVAL_CHUNK on a CPU), as the train step
    splits its batches, and their sums meet in one all-reduce. A task whose held-out metric is not a plain mean
    over examples names the examples it is computed over at once (`metric_group`: MAD's class-macro accuracy,
    over its test batches of 128), and by default a device's pass is then exactly one group, so the metric is
    the same on any number of devices: each group's, weighted by its scored positions.
    """
    loss_fn = make_loss(graphdef, task, compute_dtype)
    devices = 1 if mesh is None else mesh.size
    platform = (jax.devices() if mesh is None else mesh.devices.flat)[0].platform
    group = getattr(task, "metric_group", None) if chunk is None else None
    chunk = chunk or (CPU_EVAL_CHUNK if platform == "cpu" else ACCELERATOR_EVAL_CHUNK)

    def weighted(params, rest, chunks, device, devices):
        def one(b):
            m = b.inputs.shape[0] // devices
            b = rows(b, device * m, m)  # the whole chunk on one device
            return scored(b, loss_fn(params, rest, b)[1])

        return summed_map(one, chunks)

    mean = mean_over_devices(mesh, weighted)

    def evaluate(params, rest, batch: Batch):
        n = batch.inputs.shape[0]
        per_device = group or min(chunk, -(-n // devices))  # a group is never cut short
        size = per_device * devices  # every device its share of each chunk
        pad = -n % size

        def split(x):
            x = jnp.concatenate([x, jnp.repeat(x[:1], pad, axis=0)]) if pad else x
            return x.reshape(-1, size, *x.shape[1:])

        chunks = jax.tree.map(split, batch)
        valid = (jnp.arange(n + pad) < n).reshape(-1, size, *[1] * (batch.mask.ndim - 1))
        chunks = chunks.replace(mask=chunks.mask * valid)  # padded rows weigh nothing
        return mean(params, rest, chunks)

    return evaluate
