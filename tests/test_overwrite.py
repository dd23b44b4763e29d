"""Key overwrite: MQAR with some keys written twice, the latest value the answer, and stale answers counted."""

import jax
import numpy as np
import pytest

from conftest import sample_task, task_metrics
from tasks import TASKS, Overwrite

SMALL = dict(vocab=64, seq_len=32, num_kv_pairs=4)


@pytest.mark.parametrize("kw", [dict(num_overwrites=2), dict(num_overwrites=0),
                                dict(num_overwrites=4, random_non_queries=False)])
def test_every_target_is_the_latest_write_of_its_key(kw):
    task = Overwrite(**SMALL, **kw)
    b = sample_task(task, 64)
    V, T, kv, o = task.vocab, task.seq_len, task.num_kv_pairs, task.num_overwrites
    C = 2 * kv + 2 * o
    assert b.inputs.shape == (64, T) and b.targets.shape == b.positions.shape == b.mask.shape == (64, kv)
    for x, pos, y, dist, over, old in zip(b.inputs, b.positions, b.targets, b.meta["distance"],
                                          b.meta["overwritten"], b.meta["old_value"]):
        keys, values = x[0:C:2], x[1:C:2]
        assert ((1 <= keys) & (keys < V // 2)).all() and ((V // 2 <= values) & (values < V)).all()
        # kv distinct keys, o of them written twice; every value of the example is distinct
        assert len(set(keys)) == kv and sorted(np.unique(keys, return_counts=True)[1]) == [1] * (kv - o) + [2] * o
        assert len(set(values)) == kv + o
        # every key is queried once, at an even offset of the query region after the writes
        assert sorted(x[pos]) == sorted(set(keys)) and ((pos - C) % 2 == 0).all() and (pos >= C).all()
        for p, target, d, w, v0 in zip(pos, y, dist, over, old):
            writes = [i for i in range(0, C, 2) if x[i] == x[p]]
            assert p - d == writes[-1] and x[p - d + 1] == target  # the latest write holds the answer
            assert w == (len(writes) == 2) and v0 == x[writes[0] + 1]  # and the first the old value
        if not task.random_non_queries:
            assert (np.delete(x[C:], pos - C) == 0).all()
    # the rewrites sit anywhere after their key's first write, so no position marks a new value
    rewrites = {tuple(i for i in range(0, C, 2) if x[i] in x[:i:2]) for x in b.inputs}
    assert len(rewrites) >= (3 if o else 1)


def test_the_key_decides_the_examples():
    task = Overwrite(**SMALL, num_overwrites=2)  # the shapes of the first layout case: nothing new to compile
    a, again, other = sample_task(task, 64, seed=1), sample_task(task, 64, seed=1), sample_task(task, 64, seed=2)
    jax.tree.map(np.testing.assert_array_equal, a, again)
    assert not np.array_equal(a.inputs, other.inputs)


def test_metrics_tell_stale_answers_from_right_ones():
    task = Overwrite(**SMALL, num_overwrites=2)
    b = jax.tree.map(lambda x: x[:16], sample_task(task, 64))
    over = b.meta["overwritten"]
    one_hot = np.eye(task.vocab, dtype=np.float32)
    # stale where the key was overwritten, right elsewhere: the additive memory's failure in its purest form
    stale = 10.0 * one_hot[np.where(over, b.meta["old_value"], b.targets)]
    m = task_metrics(task, stale, b)
    assert m["stale_rate"] == 1.0 and m["accuracy_overwritten"] == 0.0 and m["accuracy_kept"] == 1.0
    assert m["accuracy"] == pytest.approx(1 - over.mean())
    # right everywhere on the first 8 examples and stale on the rest; then the stale rows unscored, like the
    # padding rows of the held-out evaluation
    mixed = np.concatenate([10.0 * one_hot[b.targets[:8]], stale[8:]])
    m = task_metrics(task, mixed, b)
    assert m["stale_rate"] == 0.5 and m["accuracy_overwritten"] == 0.5 and m["accuracy_kept"] == 1.0
    mask = b.mask.copy()
    mask[8:] = 0
    m = task_metrics(task, mixed, b.replace(mask=mask))
    assert m["stale_rate"] == 0.0 and m["accuracy_overwritten"] == m["accuracy"] == 1.0
    # a group the config cannot have reports no metric (traced only: nothing to compile)

    def names(t):
        return set(jax.eval_shape(lambda: t.loss(stale, b)[1]))
    assert names(Overwrite(**SMALL, num_overwrites=0)) == {"loss", "accuracy", "accuracy_kept"}
    assert names(Overwrite(**SMALL, num_overwrites=4)) == {"loss", "accuracy", "accuracy_overwritten", "stale_rate"}


@pytest.mark.parametrize("kw, message", [
    (dict(num_overwrites=5), "num_overwrites must be in"), (dict(num_overwrites=-1), "num_overwrites must be in"),
    (dict(seq_len=22, num_overwrites=4), "seq_len too short"), (dict(seq_len=31), "even"),
    (dict(vocab=32), "exceed"),
    (dict(power_a=0.0), "power_a"), (dict(num_kv_pairs=0), "num_kv_pairs must be at least 1"),
])
def test_bad_settings_name_the_field(kw, message):
    with pytest.raises(ValueError, match=message):
        Overwrite(**{**SMALL, "num_overwrites": 2, **kw})


def test_registered():
    assert TASKS["overwrite"] is Overwrite
