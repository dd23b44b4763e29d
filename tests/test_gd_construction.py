"""Proposition 1 loaded into the model: predictions equal K GD (and GD++) steps; alignment scores it as 1."""

import jax
import numpy as np
import pytest

from tmem.model import build_model, load_weights
from tmem.probes.gd_construction import construction_alignment, head_products, load_construction
from tmem.probes.learners import token_gd

from conftest import TINY_LINREG


def setup(tiny_cfg, *overrides):
    cfg, _ = tiny_cfg(*overrides, base=TINY_LINREG)
    b = cfg.task.sample(jax.random.key(0), 64)
    x, y = b.meta["x"], b.meta["y"]
    return cfg, build_model(cfg, cfg.task), b, (x[:, :-1], y[:, :-1], x[:, -1])


@pytest.mark.parametrize("overrides, etas, gammas", [
    (("model.depth=1",), [2.5], None),
    (("model.depth=3", "model.tie_blocks=true", "mixer.heads=2"), [2.0] * 3, None),  # K tied layers = K steps
    (("model.depth=2",), [2.0, 3.0], [0.2, 0.3]),  # GD++ with a step size per layer
    (("model.depth=2", "model.tie_blocks=true"), [2.0, 2.0], [0.25, 0.25]),
])
def test_constructed_model_equals_gd_steps(tiny_cfg, overrides, etas, gammas):
    cfg, model, b, (X, Y, xq) = setup(tiny_cfg, *overrides)
    load_construction(model, cfg, etas, gammas)
    want = token_gd(X, Y, xq, etas, gammas)
    np.testing.assert_allclose(model(b.inputs, positions=b.positions)[:, 0], want, rtol=1e-5, atol=1e-6)


def test_alignment_of_the_construction_is_one_and_recovers_eta(tiny_cfg):
    cfg, model, _, _ = setup(tiny_cfg, "model.depth=1", "mixer.heads=2")
    load_construction(model, cfg, [3.0])
    a = construction_alignment(model, cfg)
    assert a["construction_cosine"] == pytest.approx(1.0, abs=1e-9)
    assert a["construction_eta"] == pytest.approx(3.0, rel=1e-6)
    assert a["head_qk_cosine"][0] == pytest.approx(1.0) and a["head_pv_cosine"][0] == pytest.approx(1.0)


def test_alignment_sums_heads_and_ignores_the_free_scale(tiny_cfg):
    cfg, model, b, _ = setup(tiny_cfg, "model.depth=1", "mixer.heads=2")
    load_construction(model, cfg, [3.0])
    before = model(b.inputs, positions=b.positions)
    mixer = model.blocks[0].mixer
    q, k, v, p = (np.array(m.kernel[...]) for m in (mixer.query, mixer.key, mixer.value, mixer.out))
    # head 1 copies head 0 with W_Q scaled by -2 and W_V by -1/4: half the step, through the free
    # scale s <-> 1/s with s < 0; head 0 keeps the other half
    q[:, 5:], k[:, 5:], v[:, 5:], p[5:] = -2.0 * q[:, :5], k[:, :5], -0.25 * v[:, :5], p[:5]
    v[:, :5] *= 0.5
    load_weights(model, {"blocks": {0: {"mixer": {"query": {"kernel": q}, "key": {"kernel": k},
                                                  "value": {"kernel": v}, "out": {"kernel": p}}}}})
    np.testing.assert_allclose(model(b.inputs, positions=b.positions), before, rtol=1e-5, atol=1e-6)
    a = construction_alignment(model, cfg)
    assert a["construction_cosine"] == pytest.approx(1.0, abs=1e-9)
    assert a["construction_eta"] == pytest.approx(3.0, rel=1e-6)


def test_alignment_of_random_weights_is_low(tiny_cfg):
    cfg, model, _, _ = setup(tiny_cfg, "model.depth=1", "mixer.init_scale=1.0")
    assert abs(construction_alignment(model, cfg)["construction_cosine"]) < 0.5
    A, B = head_products(model.blocks[0].mixer)
    assert A.shape == B.shape == (2, 5, 5)  # the experiment's two heads


@pytest.mark.parametrize("overrides, etas, message", [
    (("mixer=softmax", "mixer.heads=1"), [1.0], "is not linear self-attention"),
    (("model.norm=layernorm",), [1.0], "model.norm=none"),
    (("model.depth=2", "model.tie_blocks=true"), [1.0, 2.0], "a tied model takes one eta"),
    (("model.depth=2",), [1.0], "one eta and gamma per layer"),
])
def test_construction_refuses_models_it_does_not_fit(tiny_cfg, overrides, etas, message):
    cfg, model, _, _ = setup(tiny_cfg, *overrides)
    with pytest.raises(ValueError, match=message):
        load_construction(model, cfg, etas)
