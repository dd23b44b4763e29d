"""The diffusion probe's reading of an attention row, on rows whose entropy and terms are known in closed form."""

import numpy as np
import pytest

from tasks import MQAR, heldout
from tmem.probes.base import ProbeInput
from tmem.probes.diffusion import echoes, pair_rows, read_lengths, reading_terms, row_entropy, run, where_weight


@pytest.mark.parametrize("beta, M", [(0.0, 7), (2.0, 63), (5.0, 1023)])
def test_terms_of_a_target_at_logit_beta_among_M_others_at_zero(beta, M):
    """Logits beta on the target and 0 on M others: Z = e^beta + M, a_t = e^beta / Z, the others' weight over
    it M e^-beta and the value noise sqrt(M) e^-beta (the note's sqrt(M) e^(beta^2/d - beta) with the others'
    similarities all 0), and the entropy log Z - beta a_t."""
    logits = np.zeros(M + 1 + 3)
    logits[2] = beta
    rows = np.exp(logits) * (np.arange(logits.size) <= M)  # three keys past the causal mask weigh nothing
    rows /= rows.sum()
    target = np.arange(logits.size) == 2
    terms = reading_terms(rows, target)
    Z = np.exp(beta) + M
    assert terms["target_weight"] == pytest.approx(np.exp(beta) / Z)
    assert terms["crowd"] == pytest.approx(M * np.exp(-beta))
    assert terms["noise"] == pytest.approx(np.sqrt(M) * np.exp(-beta))
    assert terms["entropy"] == pytest.approx(np.log(Z) - beta * np.exp(beta) / Z)


def test_a_one_hot_row_has_no_entropy_and_a_uniform_row_log_n():
    assert row_entropy(np.eye(4)).tolist() == [0.0] * 4
    assert row_entropy(np.full((2, 8), 1 / 8)) == pytest.approx([np.log(8)] * 2)


def test_pair_rows_takes_the_last_layer_head_that_weighs_the_pair_most():
    A = np.zeros((2, 1, 2, 6, 6))  # [depth, B, H, T, S]
    A[1, 0, 0, 5, [2, 3, 4]] = 0.3, 0.4, 0.3  # head 0 puts 0.7 on the pair (key at 2, value at 3)
    A[1, 0, 1, 5, [0, 3]] = 0.5  # head 1 only 0.5
    rows, pair = pair_rows(A, np.array([[5]]), np.array([[3]]))
    assert rows[0, 0].tolist() == pytest.approx([0, 0, 0.3, 0.4, 0.3, 0])
    assert pair[0, 0].tolist() == [False, False, True, True, False, False]


def test_echoes_are_the_earlier_copies_of_the_key_and_the_tokens_after_them_outside_the_pair():
    tokens = np.array([[5, 9, 7, 8, 5, 3, 5, 1, 5]])  # key 5 at 0 (its pair 0-1), copies at 4 and 6, queried at 8
    echo = echoes(tokens, np.array([[8]]), np.array([[8]]))
    assert np.flatnonzero(echo[0, 0]).tolist() == [4, 5, 6, 7]


def test_where_weight_splits_the_rest_of_the_row_among_the_other_pairs_the_trained_span_and_beyond():
    row = np.zeros((1, 1, 12))
    row[0, 0, [0, 2, 4, 8, 11]] = 0.1, 0.5, 0.1, 0.2, 0.1  # other pair, the pair (2-3), beyond, near, the query
    pair = (np.arange(12) == 2) | (np.arange(12) == 3)
    where = where_weight(row, pair[None, None], np.array([[11]]), context=4, span=4)  # offsets 0-3: keys 8-11
    assert {k: float(v[0, 0]) for k, v in where.items()} == pytest.approx(
        {"context_weight": 0.1, "near_weight": 0.3, "far_weight": 0.1})


def test_read_lengths_double_from_the_trained_length_while_the_vocabulary_exceeds_them():
    assert read_lengths(MQAR(seq_len=64, vocab=1032)) == [64, 128, 256, 512, 1024]
    assert read_lengths(MQAR(seq_len=64, vocab=300)) == [64, 128, 256]


@pytest.mark.slow  # a tiny model compiled: about a second on a quiet machine
def test_a_uniform_read_is_the_uniform_row(tiny_cfg):
    """Temperature 0 makes every row uniform over the visible keys: the entropy is log(q + 1) and the weight on
    the pair 2 / (q + 1), whatever the untrained model's accuracy (the vocabulary of 32 reads 16 tokens only)."""
    from tmem.model import build_model

    cfg, _ = tiny_cfg("mixer.qk_norm=l2", "mixer.temperature=0")
    rows, figures = run(ProbeInput(cfg=cfg, model=build_model(cfg, cfg.task), options={"examples": 8}))
    assert rows["read_length"] == [16] and 0 <= rows["accuracy"][0] <= 1
    assert rows["entropy"] == pytest.approx(rows["uniform_entropy"], abs=1e-5)
    q = np.asarray(heldout(cfg.task).positions[:8])
    assert rows["target_weight"][0] == pytest.approx(np.mean(2 / (q + 1)), abs=1e-5)
    assert 0 <= rows["echo_weight"][0] <= 1 - rows["target_weight"][0] + 1e-6
    parts = ("target_weight", "context_weight", "near_weight", "far_weight")
    assert sum(rows[k][0] for k in parts) == pytest.approx(1.0, abs=1e-5)
    assert set(figures) == {"diffusion"}
