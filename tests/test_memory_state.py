"""The memory_state probe: its measures on matrices and keys with known answers, and the probe on fresh models."""

from types import SimpleNamespace

import jax
import numpy as np
from matplotlib.figure import Figure

from tasks import MQAR
from tmem.layers import l2_normalize
from tmem.probes import PROBES, ProbeInput, memory_state
from tmem.probes.memory_state import (effective_rank, mean_squared_cosine, predicted_crosstalk, rank_at, run,
                                      stored_positions, written)

RNG = np.random.default_rng(0)


def orthonormal(d: int) -> np.ndarray:
    return np.linalg.qr(RNG.normal(size=(d, d)))[0]


def spectrum(matrix) -> np.ndarray:
    return np.linalg.svd(matrix, compute_uv=False)


def test_effective_rank_counts_equal_directions():
    Q = orthonormal(8)
    for r in (1, 3, 8):
        projector = Q[:, :r] @ Q[:, :r].T
        np.testing.assert_allclose(effective_rank(spectrum(projector)), r, rtol=1e-9)
    outer = np.outer(RNG.normal(size=8), RNG.normal(size=5))
    np.testing.assert_allclose(effective_rank(spectrum(outer)), 1.0, rtol=1e-9)
    assert effective_rank(np.zeros(4)) == 0.0
    # batched over leading axes, as the probe calls it
    np.testing.assert_allclose(effective_rank(np.array([[1.0, 1, 0], [2, 0, 0]])), [2.0, 1.0])


def test_rank90_counts_the_directions_holding_ninety_percent():
    Q = orthonormal(10)
    assert rank_at(spectrum(Q[:, :4] @ Q[:, :4].T)) == 4  # 3 of 4 equal directions hold only 75%
    assert rank_at(spectrum(np.outer(np.ones(6), np.arange(1.0, 4)))) == 1
    assert rank_at(np.array([3.0, 1.0])) == 1  # 9 of 10 exactly
    assert rank_at(np.array([2.0, 1.0, 1.0])) == 3  # 4/6, 5/6, then all
    assert rank_at(np.zeros(3)) == 0


def test_orthogonal_keys_do_not_interfere():
    keys = orthonormal(6) * RNG.uniform(0.5, 3.0, size=(6, 1))  # norms do not matter, directions do
    assert mean_squared_cosine(keys) < 1e-25
    # a pair written twice (two passes) is one stored key: its copies are not each other's crosstalk
    twice = np.concatenate([keys, keys])
    assert mean_squared_cosine(twice, np.tile(np.arange(6), 2)) < 1e-25
    np.testing.assert_allclose(mean_squared_cosine(twice), 12 / (12 * 11), rtol=1e-12)  # unlabelled: 12 of 132 are 1


def test_random_unit_keys_meet_the_notes_crosstalk():
    for d in (8, 32):
        keys = RNG.normal(size=(3, 300, d))  # three batches of 300 keys
        measured = mean_squared_cosine(keys)
        assert measured.shape == (3,)
        np.testing.assert_allclose(measured, predicted_crosstalk(d), rtol=0.05)


def test_stored_positions_hold_the_keys_of_every_pass():
    task = MQAR(vocab=64, seq_len=32, num_kv_pairs=3, num_passes=2)
    positions, pairs = stored_positions(task)
    np.testing.assert_array_equal(positions, [0, 2, 4, 6, 8, 10])
    np.testing.assert_array_equal(pairs, [0, 1, 2, 0, 1, 2])
    inputs = np.asarray(jax.jit(task.sample, static_argnums=1)(jax.random.key(0), 4).inputs)
    keys, values = inputs[:, positions], inputs[:, positions + 1]
    assert (keys < 32).all() and (values >= 32).all()  # keys from the lower half of the vocabulary
    np.testing.assert_array_equal(keys[:, :3], keys[:, 3:])  # the second pass repeats the first


def test_registered_and_refuses_other_tasks():
    probe = PROBES["memory_state"]
    assert probe.applies(SimpleNamespace(task=SimpleNamespace(name="mqar"))) is None
    assert probe.applies(SimpleNamespace(task=SimpleNamespace(name="repeat"))) == "needs an MQAR run, not 'repeat'"


def test_a_fast_weight_row_end_to_end(model_and_tokens, monkeypatch):
    # no short convolution: layer 0's keys are then its own key map of the normed embedding, computed below
    cfg, model, tokens = model_and_tokens("mixer=linear", "mixer.short_conv=0")
    tokens = jax.numpy.concatenate([tokens, tokens[:1]])  # 4 sequences in 2 chunks of 2: sums carried across
    monkeypatch.setattr(memory_state, "heldout", lambda task: SimpleNamespace(inputs=tokens))  # skip sampling
    rows, figures = run(ProbeInput(cfg=cfg, model=model, options={"chunk": 2}))
    assert rows["sequences"] == 4 and set(rows["layers"]) == {"0", "1"}
    assert set(figures) == {"memory_state_spectra", "memory_state_interference"}
    assert all(isinstance(f, Figure) for f in figures.values())

    halves = [written(model, tokens[i:i + 2])[0] for i in (0, 2)]
    d = model.blocks[0].mixer.d_key
    for i in range(2):  # the spectrum is the mean over sequences of each head's final state's
        r = rows["layers"][str(i)]
        assert r["matrix_state"] and r["shape"] == [d, d] and r["predicted_crosstalk"] == 1 / d
        S = np.concatenate([np.asarray(states[i].memory, np.float64) for states in halves])
        np.testing.assert_allclose(r["singular_values"], spectrum(S).mean(0), rtol=1e-5, atol=1e-7)
        assert all(1 <= e <= d for e in r["effective_rank"]) and all(1 <= e <= d for e in r["rank90"])

    block = model.blocks[0]
    keys = jax.jit(lambda x: l2_normalize(block.mixer.k(block.mixer_norm(model.embed(x)))))(tokens)  # one program
    k = np.moveaxis(np.asarray(keys).reshape(4, -1, cfg.mixer.heads, d), 2, 1)  # [B, H, T, d]
    positions, pairs = stored_positions(cfg.task)
    for name, at in (("key_interference", positions), ("key_interference_at_values", positions + 1)):
        np.testing.assert_allclose(rows["layers"]["0"][name], mean_squared_cosine(k[:, :, at], pairs).mean(0),
                                   rtol=1e-5)


def test_softmax_has_no_matrix_state(model_and_tokens):
    cfg, model, tokens = model_and_tokens("model.depth=1")  # TINY's softmax
    rows = memory_state.memory_state(model, tokens, cfg.task)
    assert rows["layers"] == {"0": {"mixer": "SoftmaxAttention", "matrix_state": False,
                                    "reason": "no matrix state: a KV cache, one key and value per token"}}
