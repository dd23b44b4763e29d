"""MQAR generator: Zoology's layout and distributions, sampled in pure JAX."""

import jax
import numpy as np
import pytest

from tasks import MQAR, heldout


def sample(task, n, seed=0):
    b = jax.jit(task.sample, static_argnums=1)(jax.random.key(seed), n)
    return jax.tree.map(np.asarray, b)


@pytest.mark.parametrize("kw", [dict(), dict(seq_len=128, num_kv_pairs=16, vocab=512),
                                dict(num_passes=2), dict(random_non_queries=False)])
def test_layout_invariants(kw):
    task = MQAR(**kw)
    b = sample(task, 256)
    V, T, kv = task.vocab, task.seq_len, task.num_kv_pairs
    C = 2 * kv * task.num_passes
    assert b.inputs.shape == (256, T) and b.targets.shape == b.positions.shape == (256, kv)
    for x, pos, y, dist in zip(b.inputs, b.positions, b.targets, b.meta["distance"]):
        keys, values = x[C - 2 * kv:C:2], x[C - 2 * kv + 1:C:2]
        assert ((1 <= keys) & (keys < V // 2)).all() and len(set(keys)) == kv
        assert ((V // 2 <= values) & (values < V)).all() and len(set(values)) == kv
        if task.num_passes == 2:
            np.testing.assert_array_equal(x[:2 * kv], x[2 * kv:C])
        # every key is queried exactly once, at an even offset of the query region
        assert len(set(pos)) == kv and ((pos - C) % 2 == 0).all() and (pos >= C).all() and (pos < T).all()
        assert sorted(x[pos]) == sorted(keys)
        # the target at a query is the value stored with that key, and the meta distance points at it
        for p, target, d in zip(pos, y, dist):
            j = list(keys).index(x[p])
            assert target == values[j]
            assert x[p - d] == x[p] and p - d == C - 2 * kv + 2 * j
        fill = np.setdiff1d(np.arange(C, T), pos)
        if not task.random_non_queries:
            assert (x[fill] == 0).all()


def test_filler_is_uniform_over_whole_vocabulary():
    task = MQAR()
    b = sample(task, 2000)
    fill_mask = np.ones_like(b.inputs, bool)
    fill_mask[:, :2 * task.num_kv_pairs] = False
    np.put_along_axis(fill_mask, b.positions, False, axis=1)
    counts = np.bincount(b.inputs[fill_mask], minlength=task.vocab)
    expected = fill_mask.sum() / task.vocab
    assert counts.min() > 0.7 * expected and counts.max() < 1.3 * expected


def test_query_gaps_follow_zoologys_power_law():
    """Slot inclusion frequencies match numpy's choice(replace=False, p=...), Zoology's sampler."""
    task, n = MQAR(), 20000
    C, kv = 2 * task.num_kv_pairs, task.num_kv_pairs
    space = (task.seq_len - C) // 2
    gaps = (sample(task, n, seed=3).positions - C) // 2
    ours = np.bincount(gaps.ravel(), minlength=space) / n

    p = task.power_a * np.arange(1, space + 1) ** (task.power_a - 1)
    rng = np.random.default_rng(0)
    ref = np.zeros(space)
    for _ in range(n):
        ref[rng.choice(space, kv, replace=False, p=p / p.sum())] += 1
    ref /= n
    np.testing.assert_allclose(ours, ref, atol=0.02)
    assert ours[0] > 3 * ours[-1]  # queries cluster right after the context


def test_heldout_is_fixed_and_differs_from_training_batches():
    task = MQAR(heldout_size=100)
    a, b = jax.tree.map(np.asarray, heldout(task)), jax.tree.map(np.asarray, heldout(task))
    np.testing.assert_array_equal(a.inputs, b.inputs)
    train = sample(task, 100, seed=0)
    assert not np.array_equal(a.inputs, train.inputs)


@pytest.mark.parametrize("kw, message", [
    (dict(seq_len=63), "even"), (dict(vocab=64, seq_len=64), "exceed"),
    (dict(num_kv_pairs=17), "too large"), (dict(power_a=0.0), "power_a"),
    (dict(num_kv_pairs=4, distractor_pairs=25), "too large"), (dict(distractor_place="middle"), "distractor_place"),
])
def test_bad_settings_name_the_field(kw, message):
    with pytest.raises(ValueError, match=message):
        MQAR(**kw)


@pytest.mark.parametrize("place", [pytest.param("before", marks=pytest.mark.slow), "after"])  # 2 s each
def test_distractor_document_is_never_queried_and_shares_no_token(place):
    """The queried pairs sit before or after m unqueried pairs whose keys and values they never share."""
    task = MQAR(num_kv_pairs=4, distractor_pairs=6, distractor_place=place)
    kv, m = 4, 6
    b = sample(task, 64)
    start = 2 * m if place == "before" else 0  # where the queried document begins
    other = 0 if place == "before" else 2 * kv
    for x, pos, y, dist in zip(b.inputs, b.positions, b.targets, b.meta["distance"]):
        keys, values = x[start:start + 2 * kv:2], x[start + 1:start + 2 * kv:2]
        d_keys, d_values = x[other:other + 2 * m:2], x[other + 1:other + 2 * m:2]
        assert ((1 <= d_keys) & (d_keys < task.vocab // 2)).all() and len(set(d_keys)) == m
        assert not set(d_keys) & set(keys) and not set(d_values) & set(values)
        assert (pos >= 2 * (kv + m)).all() and sorted(x[pos]) == sorted(keys)
        for p, target, d in zip(pos, y, dist):
            j = list(keys).index(x[p])
            assert target == values[j] and p - d == start + 2 * j


@pytest.mark.slow  # 3 s: two compiled samplers
def test_no_distractor_draws_the_examples_it_always_drew():
    """distractor_pairs=0 leaves the generator as it was: the same tokens from the same key, either place."""
    before, after = (sample(MQAR(distractor_place=p), 16) for p in ("before", "after"))
    np.testing.assert_array_equal(before.inputs, after.inputs)
    np.testing.assert_array_equal(after.inputs[:3, :8], [[16, 189, 110, 214, 19, 213, 70, 177],
                                                        [68, 148, 42, 239, 88, 241, 50, 135],
                                                        [57, 251, 46, 206, 64, 246, 37, 213]])
