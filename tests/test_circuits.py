"""Weight-only probes on hand-built weights: copying and Bietti et al.'s memory recall."""

import numpy as np
import pytest

from tmem.probes.circuits import copying, memory_recall

V, D, d, T = 9, 12, 4, 10


def weights(ov_sign=1.0):
    """One layer, one head, whose OV circuit maps token k (1..8) to sign * its own unembedding.

    E embeds token k as the basis vector e_k, W_V keeps dims 0..3 only, so the
    full OV circuit is E W_V W_O U; here W_V W_O is the identity on a 4-dim
    subspace and tokens 1..3 live there.
    """
    E = np.eye(V, D)
    U = E.T.copy()
    WV = np.eye(D, d)
    WO = ov_sign * np.eye(d, D)
    zero = np.zeros((1, 1, D, d))
    return {"E": E, "U": U, "P": None, "W_Q": zero, "W_K": zero, "W_V": WV[None, None],
            "W_O": WO[None, None]}


@pytest.mark.parametrize("sign, positivity, top1", [(1.0, 1.0, 3 / 8), (-1.0, -1.0, 0.0)])
def test_copying_of_an_identity_and_its_negative(sign, positivity, top1):
    c = copying(weights(sign))
    np.testing.assert_allclose(c["positivity"], [[positivity]], atol=1e-12)
    # tokens 1..3 (rows) reach their own logit; tokens 4..8 get all-zero logits, whose argmax is token 1
    np.testing.assert_allclose(c["top1"], [[top1]])


def test_copying_of_a_rotation_is_not_positive():
    w = weights()
    R = np.eye(d)
    R[1:3, 1:3] = [[0.0, -1.0], [1.0, 0.0]]  # a quarter turn of tokens 1 and 2: eigenvalues +-i
    w["W_O"] = (R @ np.eye(d, D))[None, None]
    # eigenvalues 0 (dim 0 is BOS's, left out), +-i and 1 (token 3): sum 1 over sum of moduli 3
    np.testing.assert_allclose(copying(w)["positivity"], [[1 / 3]], atol=1e-12)


def two_layer():
    """Layer 0 writes the previous token's identity, layer 1 matches it; positions one-hot."""
    E = np.zeros((V, 3 * V + T))
    E[np.arange(V), np.arange(V)] = 1.0  # token k at dim k
    P = np.zeros((T, 3 * V + T))
    P[np.arange(T), 3 * V + np.arange(T)] = 1.0  # position t at dim 3V + t
    Dm = E.shape[1]
    zero = np.zeros((Dm, Dm))
    Q0, K0, V0, O0 = zero.copy(), zero.copy(), zero.copy(), zero.copy()
    Q0[3 * V + np.arange(1, T), 3 * V + np.arange(T - 1)] = 1.0  # query at t+1 asks for position t
    K0[3 * V + np.arange(T), 3 * V + np.arange(T)] = 1.0
    V0[np.arange(V), np.arange(V)] = 1.0
    O0[np.arange(V), V + np.arange(V)] = 1.0  # write token k to the "previous token" slot V + k
    Q1, K1, V1, O1 = zero.copy(), zero.copy(), zero.copy(), zero.copy()
    Q1[np.arange(V), np.arange(V)] = 1.0  # the current token ...
    K1[V + np.arange(V), np.arange(V)] = 1.0  # ... finds the key whose previous token it is
    V1[np.arange(V), np.arange(V)] = 1.0
    O1[np.arange(V), 2 * V + np.arange(V)] = 1.0
    U = np.zeros((Dm, V))
    U[2 * V + np.arange(V), np.arange(V)] = 1.0
    stack = lambda a, b: np.stack([a, b])[:, None]  # noqa: E731  [depth=2, H=1, ...]
    return {"E": E, "U": U, "P": P, "W_Q": stack(Q0, Q1), "W_K": stack(K0, K1), "W_V": stack(V0, V1),
            "W_O": stack(O0, O1)}


def test_memory_recall_of_a_hand_built_induction_circuit():
    m = memory_recall(two_layer())
    assert m["wo1"][1, 0] == 1.0  # layer 1 copies what it attends to
    assert m["wk1"][1, 0] == 1.0  # and finds it through layer 0's previous-token write
    assert np.isnan(m["wk1"][0, 0])  # no layer below layer 0
    assert m["wk0"][0, 0] == 1.0  # layer 0 sends t + 1 to t by position alone
    assert m["wk0"][1, 0] == pytest.approx(1 / (T - 1))  # layer 1 ignores position: argmax falls on s = 0


def test_memory_recall_without_positions_and_with_a_broken_key_memory():
    w = two_layer()
    w["P"] = None
    w["W_K"] = w["W_K"].copy()
    w["W_K"][1, 0] = np.roll(w["W_K"][1, 0], 1, axis=1)  # keys now answer for the next token id
    m = memory_recall(w)
    assert np.isnan(m["wk0"]).all()
    assert m["wk1"][1, 0] < 0.2
