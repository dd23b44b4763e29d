"""The keys_move probe on cases whose answer is known: the note's logit gradient against autodiff, and a
one-layer model whose every key is a free parameter, where a key's gradient step IS its advantage-weighted
queries (cosine exactly 1)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import TINY, compose_config
from tasks.base import Batch
from tmem.model import build_model
from tmem.probes import keys_move
from tmem.probes.keys_move import _step, advantage_queries, alignment, logit_gradients

V = 32  # the vocabulary, at most the width, so the token codes can be orthonormal


@pytest.mark.slow  # two compiled programs: about 3 s here
def test_logit_gradients_are_the_softmax_chain_rule():
    # L = g . o with o = sum_s softmax(l)_s v_s: the note's a_s (v_s - o) . g against jax.grad, grouped heads too
    B, H, G, T, d = 2, 4, 2, 5, 3
    ks = jax.random.split(jax.random.key(0), 3)
    logits = jax.random.normal(ks[0], (B, H, T, T))
    v = jax.random.normal(ks[1], (B, T, G, d))
    g = jax.random.normal(ks[2], (B, T, H, d))

    def loss(logits):
        a = jax.nn.softmax(logits, -1)
        return jnp.sum(jnp.einsum("bhts,bshd->bthd", a, jnp.repeat(v, H // G, axis=2)) * g)

    formula = jax.jit(lambda logits: logit_gradients(jax.nn.softmax(logits, -1), v, g))
    np.testing.assert_allclose(formula(logits), jax.jit(jax.grad(loss))(logits), atol=1e-5)


def test_helped_queries_keep_only_positive_advantages():
    dl = jnp.array([[[[-1.0], [2.0]]]])  # one head, two queries, one key: the first helped, the second hurt
    q = jnp.array([[[[1.0, 0.0]], [[0.0, 1.0]]]])  # [B, T, H, d]
    np.testing.assert_allclose(advantage_queries(dl, q, 0.5, 1)[0, 0, 0], [0.5, -1.0])
    np.testing.assert_allclose(advantage_queries(dl, q, 0.5, 1, helped_only=True)[0, 0, 0], [0.5, 0.0])


# the tests that build a model compile its gradient program: about 10 s on the loaded 2-core machine
FREE_KEYS = pytest.mark.slow


@pytest.fixture(scope="module")
def free_keys():
    """A one-layer attention-only model over fixed orthonormal token codes (no norms, no positions): a key is
    W_K^T e_token, so one gradient step moves it by -dL/dk summed over the keys of the same token."""
    from tmem.config import validate

    cfg = validate(compose_config([*TINY, "task.vocab=32", "model.width=32", "model.depth=1", "model.norm=none",
                                   "model.positions=none", "mlp=none", "model.train_embeddings=false",
                                   "model.tie_embeddings=false"]))
    model = build_model(cfg, cfg.task, seed=0)
    assert cfg.task.vocab_size <= cfg.model.width
    model.embed.embedding[...] = jnp.eye(cfg.task.vocab_size, cfg.model.width)
    tokens = jnp.array([[3, 5, 9, 3, 12, 7, 9, 20, 3, 14, 5, 21, 8, 30, 2, 11]], jnp.int32)
    targets = jnp.roll(tokens, -1, axis=1)
    batch = Batch(inputs=tokens, targets=targets, mask=jnp.ones(tokens.shape, jnp.float32))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    layer = model.blocks[0].mixer
    layers = ((layer.kv_heads, layer.cfg.beta(layer.d_head)),)
    dks, us, helped = _step(graphdef, cfg.task, layers, params, rest, batch)
    return cfg, model, batch, tokens[0], dks[0][0], us[0][0], helped[0][0]


@FREE_KEYS
def test_a_free_keys_step_is_the_sum_of_its_tokens_advantage_weighted_queries(free_keys):
    cfg, model, batch, tokens, dk, u, _ = free_keys
    assert float(jnp.abs(u).max()) > 1e-4  # something moves
    for i, t in enumerate(np.asarray(tokens)):
        same = np.asarray(tokens) == t
        np.testing.assert_allclose(dk[i], u[same].sum(0), atol=1e-6 + 1e-4 * float(jnp.abs(u).max()))


@FREE_KEYS
def test_distinct_tokens_align_perfectly_and_the_shuffled_control_does_not(free_keys):
    cfg, model, batch, tokens, dk, u, helped = free_keys
    once = np.flatnonzero(np.bincount(np.asarray(tokens))[np.asarray(tokens)] == 1)  # tokens seen once
    report = alignment(dk[None, once], u[None, once], helped[None, once], jax.random.key(1))
    assert report["cos"] == pytest.approx(1.0, abs=1e-4) and report["cos_weighted"] == pytest.approx(1.0, abs=1e-4)
    assert report["shuffled"] < 0.5
    # the probe's own path (the same compiled step) over all keys: repeated tokens lower the mean below one
    whole = keys_move.step_alignment(model, cfg.task, batch, jax.random.key(1))["layer0"]
    assert 0.5 < whole["cos"] < 1.0 - 1e-3 and whole["keys"] == int(np.sum(np.linalg.norm(u, axis=-1) > 0))


@FREE_KEYS
def test_it_reads_only_plain_softmax_layers(tiny_cfg):
    assert keys_move.applies(tiny_cfg()[0]) is None
    assert "softmax" in keys_move.applies(tiny_cfg("mixer=linear")[0])
    assert "length_scale" in keys_move.applies(tiny_cfg("mixer.length_scale=logn")[0])
