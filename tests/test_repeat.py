"""Repeated segments: BOS first, a copy of varying period at a varying start, the mask on what is predictable."""

import jax
import numpy as np
import pytest

from tasks import TASKS, Repeat


def sample(task, n, seed=0):
    return jax.tree.map(np.asarray, jax.jit(task.sample, static_argnums=1)(jax.random.key(seed), n))


@pytest.mark.parametrize("kw", [dict(), dict(vocab=16, seq_len=20, min_period=3, max_period=10),
                                dict(loss_on="all")])
def test_layout_and_mask(kw):
    task = Repeat(**kw)
    b = sample(task, 300)
    T = task.seq_len
    assert b.inputs.shape == b.targets.shape == b.mask.shape == (300, T) and b.positions is None
    assert (b.inputs[:, 0] == 0).all() and (b.inputs[:, 1:] >= 1).all() and (b.inputs < task.vocab).all()
    np.testing.assert_array_equal(b.inputs[:, 1:], b.targets[:, :-1])  # targets are the next tokens
    for x, y, copy, mask, n, s in zip(b.inputs, b.targets, b.meta["copy"], b.mask, b.meta["period"],
                                      b.meta["start"]):
        assert task.min_period <= n <= task.max_period and 1 <= s and s + 2 * n - 1 <= T
        z = np.concatenate([x, y[-1:]])  # the T + 1 drawn tokens
        np.testing.assert_array_equal(z[s:s + n], z[s + n:s + 2 * n])
        # predictable: targets z[t+1] in the second copy after its first token, n - 1 of them
        expected = np.zeros(T)
        expected[s + n:s + 2 * n - 1] = 1
        np.testing.assert_array_equal(copy, expected)
        np.testing.assert_array_equal(mask, expected if task.loss_on == "second_copy" else np.ones(T))
    # periods and starts vary, so a head attending a fixed distance back cannot pass
    assert len(np.unique(b.meta["period"])) > (task.max_period - task.min_period) // 2
    assert len(np.unique(b.meta["start"])) > 3


def test_perfect_copier_scores_zero_loss_and_chance_elsewhere():
    task = Repeat(vocab=16, seq_len=20, min_period=3, max_period=10, loss_on="all")
    b = sample(task, 50)
    logits = 50.0 * np.eye(task.vocab)[b.targets] * b.meta["copy"][..., None]  # right only on the copy
    loss, metrics = task.loss(logits, b)
    assert float(metrics["copy_accuracy"]) == 1.0 and float(metrics["copy_loss"]) < 1e-6
    assert float(loss) > 0.5  # the unpredictable positions stay at chance


def test_registered_and_validated():
    assert TASKS["repeat"] is Repeat
    with pytest.raises(ValueError, match="max_period too large"):
        Repeat(seq_len=20, max_period=11)
    with pytest.raises(ValueError, match="loss_on"):
        Repeat(loss_on="first_copy")
