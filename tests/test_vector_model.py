"""The vector model: identity and learned read-in, tied blocks, read-out positions, config checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tmem.config import ConfigError
from tmem.model import build_model, load_weights
from tmem.vector_model import VectorModel

from conftest import TINY_LINREG


def linreg_cfg(tiny_cfg, *overrides):
    """TINY_LINREG: d = 4, an LSA layer of width 5."""
    return tiny_cfg(*overrides, base=TINY_LINREG)


def batch(cfg, n=3):
    return cfg.task.sample(jax.random.key(1), n)


def test_identity_model_predicts_minus_the_y_slot(tiny_cfg):
    cfg, _ = linreg_cfg(tiny_cfg, "model.depth=1", "mixer.init_scale=1.0")
    model = build_model(cfg, cfg.task)
    assert isinstance(model, VectorModel) and model.read_in is None
    b = batch(cfg)
    _, inter = nnx.capture(model, nnx.Intermediate)(b.inputs)
    residual = inter["residual"][0]
    np.testing.assert_allclose(model(b.inputs), -residual[..., -1], rtol=1e-6)
    np.testing.assert_allclose(model(b.inputs, positions=b.positions),
                               jnp.take_along_axis(model(b.inputs), b.positions, 1), rtol=1e-5, atol=1e-6)


def test_tied_model_applies_one_block_depth_times(tiny_cfg):
    tied_cfg, _ = linreg_cfg(tiny_cfg, "model.depth=3", "model.tie_blocks=true", "mixer.init_scale=1.0")
    untied_cfg, _ = linreg_cfg(tiny_cfg, "model.depth=3")
    tied, untied = build_model(tied_cfg, tied_cfg.task), build_model(untied_cfg, untied_cfg.task)
    assert len(tied.blocks) == 1 and len(untied.blocks) == 3
    block = nnx.to_pure_dict(nnx.state(tied, nnx.Param))["blocks"][0]
    load_weights(untied, {"blocks": {i: block for i in range(3)}})
    b = batch(tied_cfg)
    np.testing.assert_allclose(tied(b.inputs), untied(b.inputs), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("overrides", [
    ("task.format=garg", "task.score=every", "mixer.layout=causal"),
    pytest.param(("mixer=softmax", "mixer.heads=1", "model.norm=layernorm"),  # the paper's softmax and LayerNorm
                 marks=pytest.mark.slow),
    pytest.param(("model.read_in=learned", "model.width=16", "mixer=softmax", "mixer.heads=2", "model.norm=layernorm",
                  "model.positions=learned", "task.format=garg"), marks=pytest.mark.slow),  # a Garg-style model
    ("model.read_in=auto", "model.width=16", "mixer=softmax", "mixer.heads=2", "model.positions=shortformer",
     "task.format=garg"),
])
def test_other_models_read_the_task(tiny_cfg, overrides):
    cfg, _ = linreg_cfg(tiny_cfg, "model.depth=2", *overrides)
    model = build_model(cfg, cfg.task)
    b = batch(cfg)
    out = model(b.inputs, positions=b.positions)
    assert out.shape == b.targets.shape and bool(jnp.all(jnp.isfinite(out)))
    loss, _ = cfg.task.loss(out, b)
    assert float(loss) > 0


@pytest.mark.parametrize("overrides, message", [
    (("model.width=8",), "model.width=8 must equal the task's token size 5 with model.read_in=identity"),
    (("task.format=garg", "mixer.layout=prompt"), "mixer.layout=prompt reads the whole prompt at once"),
    (("model.read_in=sideways",), "model.read_in='sideways' is not one of: auto, identity, learned"),
])
def test_config_errors_are_one_line(tiny_cfg, overrides, message):
    with pytest.raises(ConfigError, match=message):
        linreg_cfg(tiny_cfg, *overrides)


def test_token_model_ties_blocks_too(tiny_cfg):
    """tie_blocks lives in the shared stack, so the token model loops one block as the vector model does."""
    tied_cfg, _ = tiny_cfg("model.depth=3", "model.tie_blocks=true")
    untied_cfg, _ = tiny_cfg("model.depth=3")
    tied, untied = build_model(tied_cfg, tied_cfg.task), build_model(untied_cfg, untied_cfg.task)
    assert len(tied.blocks) == 1 and len(untied.blocks) == 3
    weights = nnx.to_pure_dict(nnx.state(tied, nnx.Param))  # the unembedding too: it is drawn after the blocks
    load_weights(untied, {**weights, "blocks": {i: weights["blocks"][0] for i in range(3)}})
    tokens = tied_cfg.task.sample(jax.random.key(1), 2).inputs
    np.testing.assert_allclose(tied(tokens), untied(tokens), rtol=1e-5, atol=1e-6)


def test_token_tasks_reject_the_prompt_layout(tiny_cfg):
    with pytest.raises(ConfigError, match="mixer.layout=prompt"):
        tiny_cfg("mixer=lsa", "mixer.heads=1", "mixer.layout=prompt")


@pytest.mark.parametrize("overrides, layout, read_in", [
    ((), "prompt", "identity"),
    (("task.format=garg",), "causal", "identity"),
    (("model.width=16",), "prompt", "learned"),
])
def test_auto_layout_and_read_in_follow_the_task(tiny_cfg, overrides, layout, read_in):
    cfg, _ = linreg_cfg(tiny_cfg, "model.read_in=auto", *overrides)
    assert cfg.mixer.layout == layout and cfg.model.read_in == read_in
    assert build_model(cfg, cfg.task).identity == (read_in == "identity")
    mqar, _ = tiny_cfg("mixer=lsa", "mixer.heads=1")
    assert mqar.mixer.layout == "causal"  # causal linear attention on a token task
