"""Pattern completion: stored patterns, a cue with exactly the stated corruption, the pattern as the answer."""

import jax
import numpy as np
import pytest

from conftest import sample_task, task_metrics
from tasks import TASKS, Patterns
from tasks.patterns import RECALL, SEPARATOR

# 2 of 5 entries corrupted, and 4 pattern tokens: some cues lie as near another pattern as their own
SMALL = dict(vocab=6, num_patterns=3, pattern_len=5, corruption=0.4)


@pytest.mark.parametrize("kw", [dict(), SMALL, dict(num_patterns=1, corruption=0.0)])
def test_the_answer_is_the_stored_pattern_the_cue_was_made_from(kw):
    task = Patterns(**kw)
    b = sample_task(task, 64)
    P, L, V, c = task.num_patterns, task.pattern_len, task.vocab, task.num_corrupted
    assert task.seq_len == P * (L + 1) + 2 * L
    assert b.inputs.shape == (64, task.seq_len) and b.targets.shape == b.positions.shape == b.mask.shape == (64, L)
    np.testing.assert_array_equal(b.positions, np.broadcast_to(np.arange(P * (L + 1) + L, task.seq_len), (64, L)))
    for x, y, which, corrupted, decodable in zip(b.inputs, b.targets, b.meta["which"], b.meta["corrupted"],
                                                 b.meta["decodable"]):
        stored = x[:P * (L + 1)].reshape(P, L + 1)
        assert (stored[:, -1] == SEPARATOR).all() and (x[-L:] == RECALL).all()
        patterns, cue = stored[:, :-1], x[P * (L + 1):P * (L + 1) + L]
        assert ((2 <= patterns) & (patterns < V)).all() and ((2 <= cue) & (cue < V)).all()
        # the target is the cued pattern as stored, and the cue differs from it exactly where it was corrupted
        np.testing.assert_array_equal(patterns[which], y)
        np.testing.assert_array_equal(cue != y, corrupted)
        assert corrupted.sum() == c
        distance = (patterns != cue).sum(1)
        assert decodable == all((distance[i] > distance[which]) or (patterns[i] == y).all() for i in range(P))
    if c:  # the corrupted entries and the cued pattern vary across examples
        assert len({tuple(r) for r in b.meta["corrupted"]}) > 1 and len(set(b.meta["which"])) == P
    if kw == SMALL:
        assert 0 < b.meta["decodable"].mean() < 1


def test_the_key_decides_the_examples():
    task = Patterns()  # the shapes of the first layout case: nothing new to compile
    a, again, other = sample_task(task, 64, seed=1), sample_task(task, 64, seed=1), sample_task(task, 64, seed=2)
    jax.tree.map(np.testing.assert_array_equal, a, again)
    assert not np.array_equal(a.inputs, other.inputs)


def test_metrics_count_entries_whole_patterns_and_corrupted_entries():
    task = Patterns(**SMALL)
    b = sample_task(task, 64)
    L, n = task.pattern_len, 64
    one_hot = np.eye(task.vocab, dtype=np.float32)
    cue = b.inputs[:, -2 * L:-L]
    # example 0 right everywhere; the others copy the cue: right on the 3 intact entries, wrong on the 2 corrupted
    logits = 10.0 * one_hot[np.concatenate([b.targets[:1], cue[1:]])]
    m = task_metrics(task, logits, b)
    assert m["accuracy"] == pytest.approx((L + (n - 1) * 3) / (n * L)) and m["exact_match"] == pytest.approx(1 / n)
    assert m["accuracy_corrupted"] == pytest.approx(1 / n) and m["loss"] > 1
    mask = b.mask.copy()
    mask[1:] = 0  # unscored rows (the held-out evaluation's padding) count for nothing
    m = task_metrics(task, logits, b.replace(mask=mask))
    assert m["accuracy"] == m["exact_match"] == m["accuracy_corrupted"] == 1.0
    assert "accuracy_corrupted" not in jax.eval_shape(lambda: Patterns(corruption=0.0).loss(logits, b)[1])


@pytest.mark.parametrize("kw, message", [
    (dict(vocab=3), "vocab must be at least 4"), (dict(num_patterns=0), "num_patterns"),
    (dict(pattern_len=0), "pattern_len"), (dict(corruption=-0.1), "corruption must be in"),
    (dict(pattern_len=4, corruption=0.9), "leave an entry of the cue intact"),
    (dict(heldout_size=0), "heldout_size"),
])
def test_bad_settings_name_the_field(kw, message):
    with pytest.raises(ValueError, match=message):
        Patterns(**kw)


def test_corruption_rounds_to_a_whole_number_of_entries():
    assert [Patterns(pattern_len=8, corruption=f).num_corrupted for f in (0.0, 0.1, 0.25, 0.3, 0.5)] == [0, 1, 2, 2, 4]
    assert TASKS["patterns"] is Patterns
