"""The saturation probe's gradient at W_K and entropy, on models and rows where they are known exactly."""

import jax
import numpy as np
import pytest

from tasks import heldout
from tmem.probes.saturation import (batch_gradients, key_gradients, key_parts, query_entropy, read_early,
                                    sequence_gradients)


@pytest.fixture
def tiny(tiny_cfg):
    """make(*overrides) -> (a fresh tiny softmax model, its task, a held-out batch of 8)."""
    from tmem.model import build_model

    def make(*overrides):
        cfg, _ = tiny_cfg(*overrides)
        return build_model(cfg, cfg.task), cfg.task, jax.tree.map(lambda x: x[:8], heldout(cfg.task))

    return make


def zero_columns(model, start: int, stop: int) -> None:
    """Zero the columns [start, stop) of every layer's fused q, k, v kernel ([D, D + 2E]: W_Q, then W_K, W_V)."""
    for block in model.blocks:
        block.mixer.qkv.kernel[...] = block.mixer.qkv.kernel[...].at[:, start:stop].set(0.0)


@pytest.mark.slow  # a tiny model compiled: about a second on a quiet machine
def test_no_gradient_reaches_w_k_when_the_logits_cannot_depend_on_the_keys(tiny):
    """Zero queries (W_Q = 0) give every logit 0 whatever the keys: dL/dW_K is exactly 0 in every layer. Zero keys
    instead leave dL/dW_K = dL/dlogits q x^T, not 0: the probe's slice is W_K's, not W_Q's (beta = 0, the other
    way to cut the keys off, is read below)."""
    model, task, batch = tiny()
    D = model.blocks[0].mixer.heads * model.blocks[0].mixer.d_head
    zero_columns(model, 0, D)
    g = key_gradients(model, task, batch)
    assert g["key_grad_norms"] == [0.0, 0.0] and g["grad_norm"] > 1e-3
    model, task, batch = tiny()
    zero_columns(model, D, 2 * D)
    assert min(key_gradients(model, task, batch)["key_grad_norms"]) > 1e-6


@pytest.mark.slow  # a tiny model compiled: about a second on a quiet machine
def test_the_sequences_own_gradients_at_w_k_average_to_the_batchs(tiny):
    from flax import nnx

    model, task, batch = tiny()
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    whole = key_parts(model, batch_gradients(graphdef, task, params, rest, batch)[1])
    each = key_parts(model, sequence_gradients(graphdef, task, params, rest, batch))
    for w, e in zip(whole, each):
        assert e.shape == (8, *w.shape)
        np.testing.assert_allclose(np.mean(e, axis=0), w, rtol=1e-4, atol=1e-7)
    g = key_gradients(model, task, batch)
    assert 0 < g["sequence_key_grad_median"] and np.linalg.norm(g["key_grad_norms"]) <= g["sequence_key_grad_mean"]


def test_query_entropy_reads_the_rows_at_the_query_positions_of_every_layer_and_head():
    A = np.zeros((2, 1, 2, 4, 4))  # [depth, B, H, T, S]
    A[:, 0, :, 3] = 0.25  # the query at 3: uniform over 4 keys in every layer and head
    A[:, 0, :, 2, 0] = 1.0  # position 2 is not a query: one-hot, not read
    assert query_entropy(A, np.array([[3]])) == pytest.approx(np.log(4))
    A[1, 0, 1, 3] = 1.0, 0.0, 0.0, 0.0  # one of the four rows one-hot
    assert query_entropy(A, np.array([[3]])) == pytest.approx(0.75 * np.log(4))


@pytest.mark.slow  # a tiny model compiled: about a second on a quiet machine
def test_a_uniform_read_reads_as_the_uniform_row(tiny):
    """beta = 0 with unit q and k: every row uniform, and no gradient reaches W_K."""
    model, task, _ = tiny("mixer.qk_norm=l2", "mixer.temperature=0")
    rows = read_early([(0, model)], task, examples=8)
    assert rows["step"] == [0] and rows["key_grad_norm"] == [0.0]
    assert rows["entropy"][0] == pytest.approx(rows["uniform_entropy"], abs=1e-5)
