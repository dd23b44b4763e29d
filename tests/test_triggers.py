"""Bietti et al.'s trigger sequences: the bigram chain, fixed trigger outputs, the in-context mask."""

import jax
import numpy as np
import pytest

from tasks import TASKS, Triggers


def sample(task, n, seed=0):
    return jax.tree.map(np.asarray, jax.jit(task.sample, static_argnums=1)(jax.random.key(seed), n))


def test_triggers_are_followed_by_their_output_and_the_mask_marks_repeats():
    task = Triggers(vocab=16, seq_len=48, num_triggers=3)
    b = sample(task, 200)
    assert (b.inputs[:, 0] == 0).all() and (b.inputs[:, 1:] >= 1).all()
    np.testing.assert_array_equal(b.inputs[:, 1:], b.targets[:, :-1])
    predictable_total = 0
    for x, y, trig, out, pred in zip(b.inputs, b.targets, b.meta["triggers"], b.meta["outputs"],
                                     b.meta["predictable"]):
        assert len(set(trig)) == 3 and (trig >= 1).all()
        seen = set()
        for t in range(task.seq_len):
            if x[t] in trig:
                assert y[t] == out[list(trig).index(x[t])]
                assert pred[t] == (x[t] in seen)  # predictable from the second occurrence on
                seen.add(x[t])
            else:
                assert pred[t] == 0
        predictable_total += pred.sum()
    assert predictable_total > 200  # the task is not vacuous
    np.testing.assert_array_equal(b.mask, b.meta["predictable"])


def test_non_trigger_transitions_follow_the_bigram_matrix():
    task = Triggers(vocab=8, seq_len=64, num_triggers=1, dirichlet_alpha=1.0)
    b = sample(task, 1000)
    counts = np.zeros((7, 7))
    for x, y, trig in zip(b.inputs, b.targets, b.meta["triggers"]):
        free = (x >= 1) & ~np.isin(x, trig)
        np.add.at(counts, (x[free] - 1, y[free] - 1), 1)
    empirical = counts / counts.sum(1, keepdims=True)
    assert np.abs(empirical - task.bigram).max() < 0.05
    np.testing.assert_allclose(task.bigram.sum(1), 1.0)
    np.testing.assert_allclose(task.unigram @ task.bigram, task.unigram, atol=1e-9)  # stationary


def test_bigram_is_fixed_by_its_seed():
    a, b, c = Triggers(bigram_seed=1), Triggers(bigram_seed=1), Triggers(bigram_seed=2)
    np.testing.assert_array_equal(a.bigram, b.bigram)
    assert not np.allclose(a.bigram, c.bigram)


def test_registered_and_validated():
    assert TASKS["triggers"] is Triggers
    with pytest.raises(ValueError, match="num_triggers"):
        Triggers(vocab=4, num_triggers=3)
    with pytest.raises(ValueError, match="loss_on"):
        Triggers(loss_on="everything")
