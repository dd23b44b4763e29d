"""The LM: causality, read-out, intermediates, head masks, state continuation, hand-set weights."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tmem.mlps import MLPS
from tmem.model import load_weights


@pytest.mark.parametrize("overrides", [(), ("model.positions=learned",), ("model.positions=none", "mlp=swiglu"),
                                       ("model.norm=rmsnorm", "mlp=relu", "model.tie_embeddings=false")])
def test_outputs_do_not_depend_on_later_inputs(model_and_tokens, overrides):
    cfg, model, tokens = model_and_tokens(*overrides)
    t = 7
    changed = tokens.at[:, t + 1:].set((tokens[:, t + 1:] + 5) % cfg.task.vocab)
    a, b = model(tokens), model(changed)
    np.testing.assert_array_equal(a[:, :t + 1], b[:, :t + 1])
    assert not np.allclose(a[:, t + 1:], b[:, t + 1:])  # the check itself can fail


# the gradient memory's training form reads the last layer only at the positions (tmem.memory.gradient.parallel)
@pytest.mark.parametrize("overrides", [(), ("mixer=titans",), ("mixer=ttt_mlp",)])
def test_positions_read_out_the_same_logits(model_and_tokens, overrides):
    _, model, tokens = model_and_tokens(*overrides)
    positions = jnp.array([[0, 5], [3, 15], [9, 9]])
    # both reads in one program: run op by op, Titans' took 6 s from a cold cache
    full, picked = nnx.jit(lambda m, t, p: (m(t), m(t, positions=p)))(model, tokens, positions)
    np.testing.assert_allclose(picked, jnp.take_along_axis(full, positions[..., None], 1), rtol=1e-5, atol=1e-5)


def test_intermediates_expose_attention_and_residual_stream(model_and_tokens):
    cfg, model, tokens = model_and_tokens()
    _, inter = nnx.capture(model, nnx.Intermediate)(tokens)
    weights = inter["blocks"][0]["mixer"]["attention"][0]
    T, H = cfg.task.seq_len, cfg.mixer.heads
    assert weights.shape == (3, H, T, T)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
    assert float(jnp.abs(jnp.triu(weights, 1)).max()) == 0.0  # causal
    assert len(inter["residual"]) == cfg.model.depth


def test_head_mask_ablates_exactly_one_head(model_and_tokens):
    cfg, model, tokens = model_and_tokens()
    D, H = cfg.model.width, cfg.mixer.heads
    ones = jnp.ones((cfg.model.depth, H))
    np.testing.assert_allclose(model(tokens, head_mask=ones), model(tokens), rtol=1e-6)
    # ablating head 0 of block 0 equals zeroing the rows of the output projection that read it
    ablated = model(tokens, head_mask=ones.at[0, 0].set(0.0))
    kernel = model.blocks[0].mixer.out.kernel[...]
    load_weights(model, {"blocks": {0: {"mixer": {"out": {"kernel": kernel.at[: D // H].set(0.0)}}}}})
    np.testing.assert_allclose(ablated, model(tokens), rtol=1e-5, atol=1e-6)


def test_shortformer_positions_reach_queries_and_keys_only(model_and_tokens):
    cfg, model, tokens = model_and_tokens("model.positions=shortformer")
    D = cfg.model.width
    moved = lambda: {"pos_embed": model.pos_embed[...] + 1.0}  # noqa: E731
    before = model(tokens)
    load_weights(model, moved())
    assert not np.allclose(model(tokens), before)  # positions steer attention ...
    # ... but with queries and keys switched off, attention is uniform and positions leave no trace
    no_qk = {"blocks": {i: {"mixer": {"qkv": {"kernel": b.mixer.qkv.kernel[...].at[:, :2 * D].set(0.0)}}}
                        for i, b in enumerate(model.blocks)}}
    load_weights(model, no_qk)
    before = model(tokens)
    load_weights(model, moved())
    np.testing.assert_allclose(model(tokens), before, rtol=1e-6)
    # learned positions, added to the residual stream, change the output even then
    cfg, model, tokens = model_and_tokens("model.positions=learned")
    load_weights(model, no_qk)
    before = model(tokens)
    load_weights(model, moved())
    assert not np.allclose(model(tokens), before)


def test_load_weights_rejects_typos_and_shape_changes(model_and_tokens):
    _, model, _ = model_and_tokens()
    with pytest.raises(KeyError, match="no parameter blocks/0/mixr"):
        load_weights(model, {"blocks": {0: {"mixr": {}}}})
    with pytest.raises(ValueError, match="shape"):
        load_weights(model, {"embed": {"embedding": jnp.zeros((3, 3))}})


@pytest.mark.parametrize("mlp", MLPS)
def test_every_mlp_builds_and_runs(model_and_tokens, mlp):
    cfg, model, tokens = model_and_tokens(f"mlp={mlp}")
    assert model(tokens).shape == (3, cfg.task.seq_len, cfg.task.vocab)
    assert (model.blocks[0].mlp is None) == (mlp == "none")
