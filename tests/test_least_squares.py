"""The least-squares probe: its memories against independent writes with known answers, and the probe on fresh
models (the trained state's recall is the model's own; a mesa layer is its own weighted ridge solve)."""

from types import SimpleNamespace

import jax
import numpy as np
import pytest

from conftest import TINY, compose_config
from tasks import heldout
from tmem.config import validate
from tmem.memory import mesa
from tmem.model import build_model
from tmem.probes import PROBES, ProbeInput
from tmem.probes.least_squares import (_layer_memories, hebbian_memory, matrix_cosine, pair_weights,
                                       relative_distance, ridge_memory, run)

RNG = np.random.default_rng(0)


def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def written(K, V, log_a=None, beta=None, delta=False):
    """Chapter 10's write, one token at a time (the definition, key-major):
    S <- a_t S; S <- S + beta_t k_t (v_t - e S^T k_t)^T, e = 1 for the delta rule."""
    n = len(K)
    log_a, beta = np.zeros(n) if log_a is None else log_a, np.ones(n) if beta is None else beta
    S = np.zeros((K.shape[1], V.shape[1]))
    for k, v, g, b in zip(K, V, log_a, beta):
        S = np.exp(g) * S
        S = S + b * np.outer(k, v - (S.T @ k if delta else 0))
    return S


def test_a_delta_rule_of_strength_one_on_orthonormal_keys_is_least_squares():
    d = 8
    for n in (5, d):  # fewer pairs than dimensions (the minimum-norm solution) and exactly as many
        K, V = np.linalg.qr(RNG.normal(size=(d, d)))[0][:n], RNG.normal(size=(n, 3))
        S = written(K, V, delta=True)
        np.testing.assert_allclose(S, ridge_memory(K, V), atol=1e-12)
        assert relative_distance(S, ridge_memory(K, V)) < 1e-12
    K, V = unit(RNG.normal(size=(6, d))), RNG.normal(size=(6, 3))  # on keys that overlap one pass is not the solve
    assert relative_distance(written(K, V, delta=True), ridge_memory(K, V)) > 0.1


def test_a_mesa_state_is_the_weighted_ridge_of_its_writes():
    n, d, lam = 12, 6, 0.3
    K, V = unit(RNG.normal(size=(n, d))), RNG.normal(size=(n, 4))
    log_a, beta = np.log(RNG.uniform(0.7, 1.0, n)), RNG.uniform(0.1, 1.0, n)
    H = written(K, K, log_a, beta)  # mesa's gated sums: H = sum gamma_t k_t k_t^T, G = sum gamma_t k_t v_t^T
    G = written(K, V, log_a, beta)
    solved = np.asarray(mesa.solve_sums(H[None, None], G[None, None], np.full((1, d), lam)))[0, 0]
    reference = ridge_memory(K, V, pair_weights(log_a, beta), lam)
    assert relative_distance(solved, reference) < 1e-5
    assert relative_distance(solved, ridge_memory(K, V, ridge=lam)) > 0.05  # the weights matter


def test_pair_weights_are_the_decayed_add_rule():
    n, d = 9, 5
    K, V = RNG.normal(size=(n, d)), RNG.normal(size=(n, 3))
    log_a, beta = np.log(RNG.uniform(0.5, 1.0, n)), RNG.uniform(0.1, 1.0, n)
    np.testing.assert_allclose(written(K, V, log_a, beta), hebbian_memory(K, V, pair_weights(log_a, beta)),
                               rtol=1e-12)
    np.testing.assert_allclose(pair_weights(np.zeros(3), np.ones(3)), 1.0)


def test_ridge_solves_its_normal_equations_and_tends_to_least_squares():
    n, d = 20, 6
    K, V, w = RNG.normal(size=(n, d)), RNG.normal(size=(n, 3)), RNG.uniform(0.1, 2, n)
    S = ridge_memory(K, V, w, 0.5)
    np.testing.assert_allclose(K.T @ (w[:, None] * (K @ S - V)) + 0.5 * S, 0, atol=1e-10)
    np.testing.assert_allclose(ridge_memory(K, V, ridge=1e-9), np.linalg.lstsq(K, V, rcond=None)[0], atol=1e-6)
    np.testing.assert_allclose(ridge_memory(K, V), np.linalg.lstsq(K, V, rcond=None)[0], atol=1e-10)
    assert matrix_cosine(3 * S, S) == pytest.approx(1.0)
    assert relative_distance(3 * S, S) == pytest.approx(2.0)


def fresh(*overrides):
    cfg = validate(compose_config([*TINY, "model.depth=1", *overrides]))
    return cfg, build_model(cfg, cfg.task)


@pytest.fixture(scope="module")
def probed():
    """The probe on a fresh DeltaNet and a fresh mesa model (one layer, one head, 16 held-out sequences)."""
    found = {}
    for row in ("deltanet", "mesa"):
        cfg, model = fresh(f"mixer={row}", "mixer.heads=1")
        options = {"sequences": 16, "chunk": 16, "ridges": [1.0]}  # one chunk, one ridge: the fewest compiles
        found[row] = cfg, model, run(ProbeInput(cfg=cfg, model=model, options=options))
    return found


@pytest.mark.slow  # compiles two models' forwards (about 10 s)
def test_the_trained_state_recalls_as_the_model_does(probed):
    cfg, model, (report, figures) = probed["deltanet"]
    batch = heldout(cfg.task)
    logits = jax.jit(lambda x, p: model(x, positions=p))(batch.inputs[:16], batch.positions[:16])
    accuracy = float(np.mean(np.argmax(np.asarray(logits), -1) == np.asarray(batch.targets[:16])))
    assert report["recall"]["state"] == pytest.approx(accuracy)
    layer = report["layers"]["0"]
    assert layer["compared"] and set(report["recall"]) == {"state", *layer["mean_distance"]}
    assert set(figures) == {"least_squares"}
    assert all(0 <= layer["mean_distance"][name] for name in layer["mean_distance"])


@pytest.mark.slow
def test_a_mesa_layer_is_its_own_weighted_ridge(probed):
    cfg, _, (report, _) = probed["mesa"]
    layer = report["layers"]["0"]
    lam = cfg.mixer.lambda_init  # Lambda starts at lambda_init in every channel
    assert lam in report["ridges"]
    assert layer["mean_distance"][f"weighted_ridge_{lam:g}"] < 1e-4
    assert layer["mean_distance"][f"ridge_{lam:g}"] > 1e-2
    assert set(report["recall"]) == {"state"}  # its read solves: no matrix to put in its place


def test_registered_and_says_why_a_layer_is_not_compared():
    assert PROBES["least_squares"].applies(SimpleNamespace(task=SimpleNamespace(name="repeat"))) is not None
    softmax = validate(compose_config([*TINY, "mixer=softmax"]))
    assert PROBES["least_squares"].applies(softmax) == ("needs a layer that sows its writes (a fast-weight row or "
                                                        "mesa), not softmax")
    ones = np.ones((1, 4, 1, 3))
    gla = {"keys": ones, "writes": (ones, ones, ones[..., 0])}  # GLA's decay: one per key channel
    assert "per key channel" in _layer_memories(None, None, gla, [0.1])
    assert "does not sow" in _layer_memories(object(), None, {"keys": ones}, [0.1])
