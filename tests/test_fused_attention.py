"""The fused attention path (jax.nn.dot_product_attention) reads what the plain one reads, and steps aside for probes.

On a CPU JAX runs the fused call as XLA einsums, so these checks compare the
two paths' arithmetic; on a GPU the same call may pick cuDNN's kernel.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import quick_only
from tmem.memory.softmax import fused_read
from tmem.mixers.attention import SoftmaxAttention, SoftmaxConfig, SoftmaxRun

B, T, WIDTH = 2, 12, 16
# every option the fused path accepts, each at least once, and together
CASES = {
    "plain": {},
    "gqa": {"kv_heads": 2},
    "multi_query": {"kv_heads": 1},
    "window": {"window": 4},
    "logn": {"length_scale": "logn", "train_length": 4},
    "ssmax": {"length_scale": "ssmax", "train_length": 6},
    "qk_norm_l2_gate_bias": {"qk_norm": "l2", "output_gate": True, "bias": True},
    "all": {"kv_heads": 2, "window": 5, "length_scale": "ssmax", "train_length": 6, "qk_norm": "rms",
            "output_gate": True, "temperature": 0.7},
}


def layer(implementation: str, rope: bool = True, **options):
    cfg = SoftmaxConfig(heads=4, run=SoftmaxRun(implementation), **options)
    cfg = cfg if cfg.train_length is not None else dataclasses.replace(cfg, train_length=T)
    return SoftmaxAttention(cfg, WIDTH, rope=rope, rngs=nnx.Rngs(0))


def read_and_grads(implementation, options, rope=True):
    """The layer's output on a fixed input, and the gradient of a fixed projection of it by every parameter."""
    graphdef, params, rest = nnx.split(layer(implementation, rope, **options), nnx.Param, ...)
    x = jax.random.normal(jax.random.key(1), (B, T, WIDTH))
    probe = jax.random.normal(jax.random.key(2), (B, T, WIDTH))

    def loss(params, x):
        y, _ = nnx.merge(graphdef, params, rest)(x)
        return jnp.sum(y * probe), y

    (_, y), (g_params, g_x) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(params, x)
    return y, jax.tree.leaves(g_params) + [g_x]


@pytest.mark.parametrize("case", quick_only(CASES, {"plain", "all"}))  # every option at once, and none
def test_fused_path_equals_the_plain_path(case):
    y_plain, g_plain = read_and_grads("plain", CASES[case], rope=case != "window")
    y_fused, g_fused = read_and_grads("fused", CASES[case], rope=case != "window")
    assert float(jnp.abs(y_plain).max()) > 1e-3  # a read that is there to compare
    np.testing.assert_allclose(y_fused, y_plain, rtol=1e-5, atol=1e-5)
    for a, b in zip(g_fused, g_plain):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_the_fused_path_is_taken_and_steps_aside_where_it_cannot_serve(monkeypatch):
    import tmem.mixers.attention as attention

    calls = []
    monkeypatch.setattr(attention, "fused_read", lambda *a, **k: calls.append(1) or attention.fused_read_(*a, **k))
    monkeypatch.setattr(attention, "fused_read_", fused_read, raising=False)
    x = jax.random.normal(jax.random.key(1), (B, T, WIDTH))
    fused = layer("fused")
    fused(x)
    layer("plain")(x)
    assert len(calls) == 1  # the fused layer read through it, the plain one did not
    # a probe capturing intermediates still gets the weights, from the plain read
    _, inter = nnx.capture(fused, nnx.Intermediate)(x)
    (weights,) = inter["attention"]
    assert weights.shape == (B, 4, T, T)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
    assert len(calls) == 1  # the capture's read was the plain one
    # sinks, a continuation from a cache, and reads at chosen positions take the plain path
    assert layer("fused", sinks=True)._fused(None, None) is False
    assert fused._fused(object(), None) is False and fused._fused(None, jnp.arange(3)) is False
    assert fused._fused(None, None) is True
    # auto: plain on a CPU (where the fused call is no faster), fused elsewhere
    assert layer("auto")._fused(None, None) is (jax.default_backend() != "cpu")


@pytest.mark.slow  # 4 s; the quick subset continues softmax attention in tests/test_continuation.py
def test_a_continuation_through_the_fused_layer_matches_the_whole_sequence():
    x = jax.random.normal(jax.random.key(1), (B, T, WIDTH))
    fused = layer("fused", kv_heads=2, window=5)
    whole, _ = fused(x)
    first, cache = fused(x[:, :7])
    rest, _ = fused(x[:, 7:], state=cache)
    np.testing.assert_allclose(jnp.concatenate([first, rest], axis=1), whole, rtol=1e-5, atol=1e-5)


def test_an_unknown_implementation_is_one_line():
    with pytest.raises(ValueError, match="mixer.run.implementation='flash' is not one of: auto, plain, fused"):
        SoftmaxConfig(run=SoftmaxRun("flash")).check(WIDTH)
