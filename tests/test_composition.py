"""Composition scores on hand-built heads whose compositions are known."""

import numpy as np
import pytest

from tmem.probes.composition import composition_score, composition_scores, ov_circuits, pair_series, qk_circuits

D, d = 6, 2
e = np.eye(D)


def _weights(writes, key_reads, query_reads, value_reads, kv_heads=None):
    """Two layers of 2 heads: layer-0 head h reads e_0 and writes e_{writes[h]}; layer-1 head h's
    queries read e_{query_reads[h]}, keys e_{key_reads[h]}, values e_{value_reads[h]} (rank one each)."""
    def col(i):  # [D, d]: reads e_i into the head's first coordinate
        m = np.zeros((D, d))
        m[i, 0] = 1.0
        return m

    def row(i):  # [d, D]: writes the first coordinate to e_i
        m = np.zeros((d, D))
        m[0, i] = 1.0
        return m

    zeros = [np.zeros((D, d))] * 2
    W_Q = np.stack([zeros, [col(i) for i in query_reads]])
    W_K = np.stack([zeros, [col(i) for i in key_reads]])
    W_V = np.stack([[col(0)] * 2, [col(i) for i in value_reads]])
    W_O = np.stack([[row(i) for i in writes], [row(5)] * 2])
    if kv_heads is not None:
        W_K, W_V = W_K[:, :kv_heads], W_V[:, :kv_heads]
    return {"W_Q": W_Q, "W_K": W_K, "W_V": W_V, "W_O": W_O}


def test_a_write_into_what_the_keys_read_scores_one_and_elsewhere_zero():
    # head 0 writes e_1, head 1 writes e_2; layer-1 head 0's keys read e_1, head 1's keys read e_3
    s = composition_scores(_weights(writes=[1, 2], key_reads=[1, 3], query_reads=[4, 2], value_reads=[2, 4]))
    np.testing.assert_allclose(s["K"], [[1, 0], [0, 0]], atol=1e-12)
    np.testing.assert_allclose(s["Q"], [[0, 0], [0, 1]], atol=1e-12)  # head 1 writes e_2, reader 1's queries read it
    np.testing.assert_allclose(s["V"], [[0, 0], [1, 0]], atol=1e-12)


def test_grouped_kv_heads_share_their_keys():
    # one kv head for both query heads: both readers' keys read e_1, which layer-0 head 0 writes
    s = composition_scores(_weights(writes=[1, 2], key_reads=[1, 3], query_reads=[4, 4], value_reads=[4, 4],
                                    kv_heads=1))
    np.testing.assert_allclose(s["K"], [[1, 1], [0, 0]], atol=1e-12)


def test_score_is_the_cosine_for_rank_one_circuits_and_the_frobenius_ratio_otherwise():
    rng = np.random.default_rng(0)
    a, b, c, u = rng.normal(size=(4, D))
    # OV writes along b, QK reads keys along u: K-composition |cos(b, u)|
    ov, qk = np.outer(a, b), np.outer(c, u)
    expected = abs(b @ u) / np.linalg.norm(b) / np.linalg.norm(u)
    assert composition_score(qk, ov.T) == pytest.approx(expected)
    A, B = rng.normal(size=(2, D, D))
    assert composition_score(A, B) == pytest.approx(np.linalg.norm(A @ B) / np.linalg.norm(A) / np.linalg.norm(B))
    assert composition_score(np.zeros((D, D)), B) == 0.0


def test_circuits_are_the_row_vector_products():
    rng = np.random.default_rng(1)
    (W_Q, W_K, W_V), W_O = rng.normal(size=(3, D, d)), rng.normal(size=(d, D))
    np.testing.assert_allclose(ov_circuits(W_V[None], W_O[None])[0], W_V @ W_O)
    np.testing.assert_allclose(qk_circuits(W_Q[None], W_K[None])[0], W_Q @ W_K.T)


def test_pair_series_averages_named_pairs_against_the_rest():
    m = np.array([[0.9, 0.1], [0.2, 0.3]])
    s = pair_series([m, m / 2], writers=[[0, 0]], readers=[[1, 0]])
    assert s["pairs"] == pytest.approx([0.9, 0.45])
    assert s["others"] == pytest.approx([0.2, 0.1])
    assert pair_series([m], writers=[], readers=[[1, 0]])["pairs"] == [None]
