"""Tying two of softmax attention's maps (mixer.tie), and the roles probe's measures on maps with known answers."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from conftest import TINY, compose_config
from tmem.config import ConfigError, validate
from tmem.mixers.attention import SoftmaxAttention
from tmem.model import build_model
from tmem.probes import PROBES
from tmem.probes.roles import map_cosine, random_overlap, roles, subspace_overlap

RNG = np.random.default_rng(0)


def test_overlap_is_one_for_one_subspace_zero_for_orthogonal_and_d_over_D_for_random():
    D, d = 32, 4
    Q = np.linalg.qr(RNG.normal(size=(D, D)))[0]
    A = Q[:, :d] @ RNG.normal(size=(d, d))  # the same column space, other coordinates
    B = Q[:, :d] @ RNG.normal(size=(d, d))
    assert subspace_overlap(A, B) == pytest.approx(1.0)
    assert subspace_overlap(A, Q[:, d:2 * d]) == pytest.approx(0.0, abs=1e-12)
    assert map_cosine(A, 2 * A) == pytest.approx(1.0)
    assert abs(map_cosine(A, B)) < 1  # the same directions, differently arranged
    draws = [subspace_overlap(RNG.normal(size=(D, d)), RNG.normal(size=(D, d))) for _ in range(400)]
    assert np.mean(draws) == pytest.approx(random_overlap(D, d), rel=0.1)


def tiny(*overrides):
    cfg = validate(compose_config([*TINY, "mixer=softmax", *overrides]))
    return cfg, build_model(cfg, cfg.task)


@pytest.mark.slow  # builds and calls two models (about 2 s of CPU)
def test_a_tied_layer_reads_as_the_untied_one_with_that_map_copied():
    x = jax.random.normal(jax.random.key(0), (2, 6, 16))
    for tie, (source, target) in (("kv", (1, 2)), ("qk", (1, 0))):
        cfg, model = tiny(f"mixer.tie={tie}")
        tied = model.blocks[0].mixer
        untied = SoftmaxAttention(dataclasses.replace(cfg.mixer, tie="none"), 16, rope=False, rngs=nnx.Rngs(0))
        kernel = np.asarray(tied.qkv.kernel[...])
        parts = np.split(kernel, 3, axis=1)  # q, k, v of a layer whose kv heads are its heads
        parts[target] = parts[source]
        untied.qkv.kernel[...] = np.concatenate(parts, axis=1)
        untied.out.kernel[...] = tied.out.kernel[...]
        np.testing.assert_allclose(tied(x)[0], untied(x)[0], rtol=1e-5, atol=1e-6)
        untied.qkv.kernel[...] = kernel  # the same parameters read untied: another function
        assert not np.allclose(tied(x)[0], untied(x)[0], atol=1e-3)
        report = roles(model)
        assert report[f"mean_{tie}_cosine"] == pytest.approx(1.0)
        assert report[f"mean_{tie}_overlap"] == pytest.approx(1.0)


@pytest.mark.slow
def test_an_untied_layer_starts_near_the_random_overlap():
    _, model = tiny()
    report = roles(model)
    assert report["mean_kv_cosine"] < 0.5
    layer = report["layers"]["0"]
    assert layer["random_overlap"] == 8 / 16  # two heads of 8 in a width of 16
    assert PROBES["roles"].applies(validate(compose_config([*TINY, "mixer=softmax"]))) is None
    assert "deltanet" in PROBES["roles"].applies(validate(compose_config([*TINY, "mixer=deltanet"])))


def test_a_bad_tie_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="mixer.tie='vq' is not one of: none, kv, qk"):
        tiny("mixer.tie=vq")
    with pytest.raises(ConfigError, match="mixer.tie=qk needs a key head per query head"):
        tiny("mixer.tie=qk", "mixer.kv_heads=1")
