"""The learned_keys probe: its replayed read kernel against the write's definition, its predictions on keys with
known answers (orthonormal, identical, the delta rule's exact and inexact cases), and the probe on a fresh model."""

from types import SimpleNamespace

import numpy as np
import pytest

from conftest import TINY, compose_config
from tasks import heldout
from tmem.config import validate
from tmem.memory.linear_state import recurrent
from tmem.model import build_model
from tmem.probes import PROBES
from tmem.probes.learned_keys import (by_pairs_report, chance, key_measures, learned_keys, nearest_value,
                                      nearest_written, queried_pairs, read_weights, retrieved, signal_to_crosstalk,
                                      unit_keys, write_offset)
from tmem.probes.memory_state import read_through

RNG = np.random.default_rng(0)


def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


SIZE = 8  # every sequence below padded to one shape: one compile of the replay per rule


def one_sequence(K, Q=None, log_a=None, delta=False) -> np.ndarray:
    """The read weights [T, T] of one head writing keys K [T, d] (T, d <= SIZE) and reading with Q (default K),
    run as one [1, SIZE, 1, SIZE] sequence whose first tokens write zero keys, which write nothing."""
    T, d = K.shape
    pad = lambda x: np.pad(np.asarray(x, np.float32), ((SIZE - T, 0), (0, SIZE - d)))[None, :, None]  # noqa: E731
    log_a = np.zeros(T) if log_a is None else log_a
    W = read_weights(pad(K if Q is None else Q), pad(K), pad(np.asarray(log_a)[:, None])[..., :1],
                     np.ones((1, SIZE, 1), np.float32), delta=delta)
    return np.asarray(W, np.float64)[0, SIZE - T:, 0, SIZE - T:]


@pytest.mark.parametrize("delta, decay", [(True, "scalar"), (False, "vector")])
def test_the_read_is_the_weights_times_the_values(delta, decay):
    """Every write is linear in its values, so the recurrence on the values is W @ V (W from one-hot values)."""
    B, T, H, d, dv = 2, 7, 2, 4, 3
    q, k = RNG.normal(size=(B, T, H, d)), unit(RNG.normal(size=(B, T, H, d)))
    v = RNG.normal(size=(B, T, H, dv)).astype(np.float32)
    log_a = np.log(RNG.uniform(0.5, 1, (B, T, H, 1 if decay == "scalar" else d)))
    beta = RNG.uniform(0.2, 1, (B, T, H))
    W = np.asarray(read_weights(q, k, log_a, beta, delta=delta), np.float64)
    o = np.asarray(recurrent(q, k, v, log_a=log_a, beta=beta, delta=delta)[0], np.float64)
    np.testing.assert_allclose(np.einsum("bths,bshd->bthd", W, v), o, atol=1e-5)
    later = np.triu_indices(T, 1)
    assert np.all(W[:, later[0], :, later[1]] == 0)  # causal: no read weighs a later write


def test_the_add_rule_kernel_is_the_gram_matrix_and_a_decay_ages_it():
    T, d = 6, 5
    K, Q = unit(RNG.normal(size=(T, d))), RNG.normal(size=(T, d))
    np.testing.assert_allclose(one_sequence(K, Q), np.tril(Q @ K.T), atol=1e-5)
    log_a = np.log(RNG.uniform(0.5, 1, T))
    age = np.tril(np.exp(np.cumsum(log_a)[:, None] - np.cumsum(log_a)[None, :]))  # prod_{s < r <= t} a_r
    np.testing.assert_allclose(one_sequence(K, Q, log_a), np.tril(Q @ K.T) * age, atol=1e-5)


def test_orthonormal_keys_hold_every_pair_under_either_write():
    d, P = 8, 8  # as many pairs as dimensions
    K, V = np.linalg.qr(RNG.normal(size=(d, d)))[0][:P], RNG.normal(size=(P, 5))
    everyone = np.arange(P)
    for delta in (False, True):
        W = one_sequence(K, delta=delta)  # read at each pair's own key
        np.testing.assert_allclose(W, np.eye(P), atol=1e-5)
        assert retrieved(W, everyone).all() and nearest_value(W @ V, V, everyone).all()
        assert (signal_to_crosstalk(W, everyone) > 1e3).all()


def test_identical_keys_hold_nothing():
    P, d = 5, 8
    K = np.repeat(unit(RNG.normal(size=(1, d))), P, 0)
    W = one_sequence(K)[-1:].repeat(P, 0)  # the last read, after every write, at each pair's (same) key
    assert not retrieved(W, np.arange(P)).any()  # every pair weighed alike: a tie is no retrieval
    np.testing.assert_allclose(signal_to_crosstalk(W, np.arange(P)), 1 / np.sqrt(P - 1), rtol=1e-5)


def test_every_value_written_up_to_the_read_competes():
    values = np.eye(4)  # four tokens' values; the read is made at token 2, its pair written at token 0
    own, at = np.array([0, 0, 0]), np.array([2, 2, 2])
    reads = np.array([[1.0, 0.5, 0, 0.9], [0.4, 1.0, 0, 0], [0.4, 0, 0, 1.0]])
    # a later value (token 3) does not compete; an earlier one that is no pair's (token 1) does
    np.testing.assert_array_equal(nearest_written(reads, values, own, at), [True, False, True])
    assert nearest_value(reads, values[[0, 2]], np.zeros(3, int)).all()  # among the pairs' values alone: all


def test_the_delta_rule_keeps_the_newest_pair_exactly_and_older_ones_only_on_orthogonal_keys():
    """beta = 1: after writing k_t the state reads v_t at k_t exactly; a later key that overlaps k_t disturbs it
    (k1 = e1, k2 = (e1 + e2)/sqrt 2 reads v1/2 + v2/sqrt 2 at k1), so one pass over independent keys is not
    least squares, and the replay is the sequential rule."""
    K = np.array([[1.0, 0.0], [1.0, 1.0]]) / np.array([[1.0], [np.sqrt(2)]])  # k1 = e1, k2 = (e1 + e2)/sqrt 2
    final = one_sequence(K, delta=True)[-1]  # the read weights after both writes, at k2
    np.testing.assert_allclose(final, [0, 1], atol=1e-6)
    at_k1 = one_sequence(K, Q=np.array([[1.0, 0.0], [1.0, 0.0]]), delta=True)[-1]
    np.testing.assert_allclose(at_k1, [0.5, 1 / np.sqrt(2)], atol=1e-6)
    np.testing.assert_allclose(one_sequence(K, Q=np.array([[1.0, 0.0], [1.0, 0.0]]))[-1], [1, 1 / np.sqrt(2)],
                               atol=1e-6)  # the add rule: v1 + v2/sqrt 2


def test_write_offset_finds_where_the_queries_look():
    T, P, Q = 20, 4, 4
    pair, keys_at = RNG.permutation(P)[None], 2 * np.arange(P)
    weights = RNG.normal(scale=0.01, size=(1, Q, T))
    weights[0, np.arange(Q), keys_at[pair[0]] + 2] = 1.0  # each query weighs its pair's key token + 2
    offset, means = write_offset(weights, pair, keys_at, range(4))
    assert offset == 2 and means[2] == pytest.approx(1.0, abs=0.05) and max(means[:2] + means[3:]) < 0.1


def test_queried_pairs_reads_the_layout():
    task = SimpleNamespace(num_kv_pairs=3, num_passes=1)
    inputs = np.array([[5, 40, 7, 41, 9, 42, 0, 9, 0, 5, 0, 7]])
    pair, keys_at = queried_pairs(inputs, np.array([[7, 9, 11]]), task)
    np.testing.assert_array_equal(pair, [[2, 0, 1]])
    np.testing.assert_array_equal(keys_at, [0, 2, 4])


def test_key_measures_and_the_random_baseline():
    import jax

    d = 32
    measured = key_measures(np.linalg.qr(RNG.normal(size=(d, d)))[0][None, None, :6])
    assert measured["effective_rank"] == pytest.approx(6) and measured["mean_cos2"] == pytest.approx(0, abs=1e-12)
    random = key_measures(unit_keys(jax.random.key(0), (32, 1, 16, d)))
    assert random["mean_cos2"] == pytest.approx(1 / d, rel=0.1)  # the note's E[cos^2] = 1/d_k (D1)
    assert chance(1.0, 0.7) == pytest.approx(0.7) and chance(0.5, 0.5) == pytest.approx(0.5)


@pytest.mark.slow  # compiles a tiny model's forward and the replay (about 1.5 s)
def test_the_replayed_kernel_reads_what_the_layer_stored():
    """The captured keys, queries and writes are what the layer used: W at the last token times the values is
    the layer's final state read at its last query; and the probe's report on the same sequences."""
    cfg = validate(compose_config([*TINY, "model.depth=1", "mixer=deltanet", "mixer.heads=1"]))
    model = build_model(cfg, cfg.task)
    batch = heldout(cfg.task)
    batch = batch.replace(**{f: getattr(batch, f)[:16] for f in ("inputs", "targets", "mask", "positions")})
    _, states, sown = read_through(model, batch.inputs, ("keys", "queries", "writes"))  # the probe's own pass
    s = sown[0]
    values, log_a, beta = (np.asarray(x) for x in s["writes"])
    W = np.asarray(read_weights(s["queries"], s["keys"], log_a, beta, delta=True))
    read = np.einsum("bhs,bshd->bhd", W[:, -1], values)
    stored = np.einsum("bhkd,bhk->bhd", np.asarray(states[0].matrix(model.blocks[0].mixer)),
                       np.asarray(s["queries"])[:, -1])
    np.testing.assert_allclose(read, stored, atol=1e-5)
    report = by_pairs_report([learned_keys(model, batch, cfg.task, chunk=16)])
    layer = report["layers"]["0"]
    assert report["pairs"] == [cfg.task.num_kv_pairs] and 0 <= report["measured"][0] <= 1
    assert all(0 <= layer[name][0] <= 1 for name in ("kernel", "read", "random_kernel", "random_read",
                                                      "agreement_read"))
    assert layer["d_key"] == [16] and 0 <= layer["write_offset"][0] < 4


def test_registered_and_says_what_it_reads():
    assert PROBES["learned_keys"].applies(SimpleNamespace(task=SimpleNamespace(name="repeat"))) is not None
    softmax = validate(compose_config([*TINY, "mixer=softmax"]))
    assert "not 'softmax'" in PROBES["learned_keys"].applies(softmax)
