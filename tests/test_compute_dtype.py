"""train.compute_dtype=bfloat16: activations and matmuls in bfloat16, parameters and optimizer state in float32."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tmem.config import ConfigError
from tmem.train.build import build
from tmem.train.step import make_loss, make_train_step


def loss_and_grads(cfg, dtype):
    built = build(cfg)
    graphdef, state = built.graphdef, built.state
    batch = cfg.task.sample(jax.random.key(5), 16)
    fn = jax.value_and_grad(make_loss(graphdef, cfg.task, dtype), has_aux=True)
    (loss, _), grads = jax.jit(fn)(state.params, state.rest, batch)
    return float(loss), grads, (fn, state, batch)


# gated DeltaNet: its memory keeps float32 math inside a bfloat16 model. Both slow (4 s and more): the quick subset
# runs a bfloat16 step in test_a_bfloat16_step_keeps_parameters_and_optimizer_state_in_float32
@pytest.mark.slow
@pytest.mark.parametrize("mixer", ["softmax", "gated_deltanet"])
def test_bfloat16_agrees_with_float32_within_its_precision(tiny_cfg, mixer):
    cfg, _ = tiny_cfg(f"mixer={mixer}")
    loss32, grads32, _ = loss_and_grads(cfg, "float32")
    loss16, grads16, (fn, state, batch) = loss_and_grads(cfg, "bfloat16")
    assert loss16 == pytest.approx(loss32, rel=2e-2) and loss16 != loss32  # it really rounded
    g32, g16 = (np.concatenate([np.ravel(x) for x in jax.tree.leaves(g)]) for g in (grads32, grads16))
    assert np.linalg.norm(g16 - g32) <= 0.05 * np.linalg.norm(g32)
    assert {x.dtype for x in jax.tree.leaves(grads16)} == {jnp.dtype(jnp.float32)}  # for the float32 parameters
    # the matmuls of the forward pass run in bfloat16, not just a cast at the end
    program = str(jax.make_jaxpr(fn)(state.params, state.rest, batch))
    assert "dot_general" in program and "bf16[" in program
    assert any("dot_general" in line and "bf16[" in line.split("=")[0] for line in program.splitlines())


@pytest.mark.slow  # 3 s: a compiled step; the quick subset keeps the bfloat16 forward's agreement above
def test_a_bfloat16_step_keeps_parameters_and_optimizer_state_in_float32(tiny_cfg):
    cfg, _ = tiny_cfg("train.compute_dtype=bfloat16")
    built = build(cfg)
    step = jax.jit(make_train_step(built.graphdef, cfg.task, built.tx, 16, built.schedule, None, None,
                                   cfg.train.compute_dtype))
    state, metrics = step(step(built.state)[0])  # two steps: warmup's first rate is 0
    assert np.isfinite(float(metrics["loss"]))
    floats = [x for x in jax.tree.leaves((nnx.to_pure_dict(state.params), state.opt_state))
              if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)]
    assert floats and {x.dtype for x in floats} == {jnp.dtype(jnp.float32)}
    before = jax.tree.leaves(nnx.to_pure_dict(built.state.params))  # not donated: still readable
    assert any(not np.array_equal(a, b) for a, b in zip(before, jax.tree.leaves(nnx.to_pure_dict(state.params))))


def test_an_unknown_compute_dtype_is_one_line(tiny_cfg):
    with pytest.raises(ConfigError, match="train.compute_dtype"):
        tiny_cfg("train.compute_dtype=float16")
