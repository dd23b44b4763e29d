"""MAD's six tasks: each generator's layout and test positions, the macro accuracy, and a few training steps."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import compose_config, quick_only
from tasks import TASKS
from tasks.mad import macro_accuracy
from tasks.mad_compression import Compression
from tasks.mad_fuzzy_recall import FuzzyInContextRecall
from tasks.mad_memorization import Memorization
from tasks.mad_recall import InContextRecall, NoisyInContextRecall
from tasks.mad_selective_copying import SelectiveCopying
from tmem.config import ConfigError, validate

N = 64


@functools.cache
def sampler(task, n):
    """Training and test batches from the same key, compiled once per task."""
    return jax.jit(lambda k: (task.sample(k, n), task.sample_heldout(k, n)))


def draw(task, n=N, seed=0):
    return jax.tree.map(np.asarray, sampler(task, n)(jax.random.key(seed)))


def check_determinism(task, train):
    again, _ = draw(task, n=len(train.inputs))
    np.testing.assert_array_equal(again.inputs, train.inputs)
    other, _ = draw(task, n=len(train.inputs), seed=1)
    assert not np.array_equal(other.inputs, train.inputs)


@pytest.mark.parametrize("task", [InContextRecall(vocab=24, seq_len=40),
                                  NoisyInContextRecall(seq_len=40, frac_noise=0.5)], ids=["plain", "noisy"])
def test_in_context_recall(task):
    train, test = draw(task)
    T, V, plain = task.seq_len, task.vocab, task.vocab - task.noise_vocab_size
    K = plain // 2
    assert train.inputs.shape == train.targets.shape == (N, T - 1)  # MAD's model reads seq_len - 1 tokens
    np.testing.assert_array_equal(train.inputs, test.inputs)  # the flag changes only what is scored
    np.testing.assert_array_equal(train.targets[:, :-1], train.inputs[:, 1:])  # next token everywhere
    assert (train.mask == 1).all()
    noise_pairs = 0
    for x, y, scored in zip(train.inputs, train.targets, test.mask):
        seq = np.append(x, y[-1]).reshape(-1, 2)
        noisy = (seq >= plain).any(1)
        assert ((seq[noisy] >= plain) & (seq[noisy] < V)).all()  # noise pairs are two noise tokens
        keys, values = seq[~noisy, 0], seq[~noisy, 1]
        assert ((keys < K) & (values >= K) & (values < plain)).all()
        value_of, want = {}, np.zeros(T - 1)
        for j, (k, v) in enumerate(seq):
            if noisy[j]:
                continue
            if k in value_of:
                assert value_of[k] == v  # a key keeps its value
                want[2 * j] = 1  # ... which the context then determines: a test position
            value_of[k] = v
        assert not noisy[-1] and want[-1] == 1  # the probe: a key shown in the body, and its value
        np.testing.assert_array_equal(scored, want)
        noise_pairs += noisy.sum()
    assert abs(noise_pairs / (N * (T // 2 - 2)) - task.frac_noise) < 0.05
    check_determinism(task, train)


def runs(x, K, pad):
    """The alternating key and value motifs of a fuzzy-recall sequence: [(key, value, start of value)]."""
    out, i = [], int(np.argmax(x != pad))
    assert i >= 1 and (x[:i] == pad).all()
    while i < len(x):
        j = i
        while j < len(x) and x[j] < K:
            j += 1
        k = j
        while k < len(x) and K <= x[k] < pad:
            k += 1
        out.append((tuple(x[i:j]), tuple(x[j:k]), j))
        i = k
    return out


def test_fuzzy_in_context_recall():
    task = FuzzyInContextRecall(seq_len=64)
    train, test = draw(task, n=32)
    T, pad, K, M = task.seq_len, task.vocab - 1, (task.vocab - 1) // 2, task.k_motif_size + task.v_motif_size
    assert train.inputs.shape == (32, T) and (train.mask == 1).all()
    np.testing.assert_array_equal(train.targets[:, :-1], train.inputs[:, 1:])
    key_sizes = {"train": set(), "test": set()}
    for split, batch in (("train", train), ("test", test)):
        for x, y, scored in zip(batch.inputs, batch.targets, batch.mask):
            seq = np.append(x, y[-1])
            pairs = runs(seq, K, pad)
            assert T - M <= T + 1 - int(np.argmax(seq != pad)) <= T - 1  # filled as MAD fills, then padded
            value_of, want, unscored = {}, np.zeros(T + 1), []
            for key, value, at in pairs:
                assert 1 <= len(key) <= task.k_motif_size and 1 <= len(value) <= task.v_motif_size
                assert len(set(key)) == len(key) and len(set(value)) == len(value)  # motifs of distinct tokens
                key_sizes[split].add(len(key))
                if key in value_of:
                    assert value_of[key] == value
                    want[at:at + len(value)] = 1
                value_of[key] = value
            probe, value, at = pairs[-1]
            assert sum(k == probe for k, _, _ in pairs) >= 2 and want[at] == 1  # the final query is answerable
            got = np.append(0, scored)
            if split == "test":
                assert (got <= want).all()  # scored values are recoverable from the context ...
                unscored = {k for k, _, a in pairs if want[a] and not got[a]}
                assert unscored <= {probe}  # ... and all are scored but the probe's first insertion
    assert key_sizes == {"train": {1, 2, 3}, "test": {3}}  # test keys always the longest, as MAD's
    check_determinism(task, train)


def test_selective_copying():
    task = SelectiveCopying(vocab=10, seq_len=40, num_tokens_to_copy=6)
    train, test = draw(task)
    T, n, blank, copy = task.seq_len, task.num_tokens_to_copy, task.vocab - 2, task.vocab - 1
    jax.tree.map(np.testing.assert_array_equal, train, test)  # MAD's targets are the same in training and test
    assert train.inputs.shape == (N, T) and train.targets.shape == train.positions.shape == (N, n)
    assert (train.positions == np.arange(T - n, T)).all()
    assert (train.inputs[:, T - n - 1] == copy).all() and (train.inputs[:, T - n:] == blank).all()
    data = train.inputs[:, :T - n - 1]
    for row, targets in zip(data, train.targets):
        np.testing.assert_array_equal(row[row != blank], targets)  # the tokens to copy, in order
        assert row[-1] != blank  # MAD inserts blanks only before tokens
    assert (train.targets < task.vocab - 2).all()
    assert len({tuple(np.flatnonzero(r != blank)) for r in data}) > N // 2  # the blanks move
    check_determinism(task, train)


def test_compression():
    task = Compression(vocab=12, seq_len=20)
    train, test = draw(task)
    jax.tree.map(np.testing.assert_array_equal, train, test)
    assert train.inputs.shape == (N, 20) and (train.inputs[:, -1] == 11).all() and (train.inputs[:, :-1] < 11).all()
    np.testing.assert_array_equal(train.targets, train.inputs)  # rebuild the input, not predict the next token
    assert len(np.unique(train.inputs[:, :-1])) == 11
    check_determinism(task, train)


def test_memorization():
    task = Memorization(vocab=40, seq_len=12)
    train, test = draw(task)
    K, insert = (task.vocab - 1) // 2, task.vocab - 1
    jax.tree.map(np.testing.assert_array_equal, train, test)
    values = np.asarray(task.values())
    assert len(set(values)) == K and ((values >= K) & (values < insert)).all()  # one value per key, distinct
    assert (train.positions == np.arange(1, 12, 2)).all() and (train.inputs[:, 1::2] == insert).all()
    keys = train.inputs[:, ::2]
    assert (keys < K).all() and len(np.unique(keys)) == K
    np.testing.assert_array_equal(train.targets, values[keys])  # the same fixed map in every example
    other = np.asarray(Memorization(vocab=40, seq_len=12, map_seed=1).values())
    assert not np.array_equal(other, values)
    assert task.train_examples == 256  # MAD's training set
    check_determinism(task, train)


def test_macro_accuracy_is_torchmetrics_macro_average():
    def score(predicted, targets, mask=None, classes=3):
        logits = jax.nn.one_hot(jnp.array(predicted), classes)
        mask = jnp.ones(len(targets)) if mask is None else jnp.array(mask, jnp.float32)
        return float(macro_accuracy(logits, jnp.array(targets), mask))

    assert score([2, 1, 0, 1], [2, 1, 0, 0]) == pytest.approx(5 / 6)  # torchmetrics' docstring example
    assert score([2, 1, 0, 1], [2, 1, 0, 0], mask=[1, 1, 1, 0]) == 1.0  # unscored positions do not count
    # class 1 missed scores 0, and so does class 3, predicted but never true; class 2, neither, is not counted
    assert score([0, 0, 3], [0, 0, 1], classes=5) == pytest.approx(1 / 3)
    assert score([0, 0, 0, 1], [0, 0, 0, 1]) == 1.0  # class 2 neither true nor predicted: not counted


SMALL = {
    "mad_in_context_recall": ["task.seq_len=16"],
    "mad_noisy_in_context_recall": ["task.seq_len=16"],
    "mad_fuzzy_in_context_recall": ["task.seq_len=16"],
    "mad_selective_copying": ["task.seq_len=16", "task.num_tokens_to_copy=4"],
    "mad_compression": ["task.seq_len=8"],
    "mad_memorization": ["task.vocab=32", "task.seq_len=8"],
}


TRAINED = {"mad_compression", "mad_memorization"}  # a head and a layout of their own; the rest share the LM's


# the quick subset: a recall task (each task's sampler has its own quick tests above; compression's head of its own
# compiles for 3 s, in the full suite)
@pytest.mark.parametrize("name", quick_only(SMALL, {"mad_in_context_recall"}))
def test_each_config_composes_and_trains(name):
    """Two compiled steps for the tasks with their own head or layout; the others trace the step (a compile each
    costs seconds, and their examples are tested above)."""
    from flax import nnx

    from tmem.autoencoder import AutoEncoder
    from tmem.train.build import build
    from tmem.train.step import make_train_step

    cfg = validate(compose_config([f"task={name}", *SMALL[name], "task.heldout_size=8", "model.width=16",
                                   "model.depth=1", "mixer.heads=2", "train.batch_size=4", "logger=disabled"]))
    assert cfg.task.name == name and cfg.train.target == 0.999
    assert cfg.task.train_examples == (256 if name == "mad_memorization" else 12800)
    built = build(cfg)
    assert isinstance(built.model, AutoEncoder) == (name == "mad_compression")
    train_step = make_train_step(built.graphdef, cfg.task, built.tx, 4, built.schedule)
    if name not in TRAINED:
        _, metrics = jax.eval_shape(train_step, built.state)
        assert metrics["loss"].shape == metrics["macro_accuracy"].shape == ()
        return
    before = jax.tree.map(np.array, nnx.to_pure_dict(built.state.params))
    step = jax.jit(train_step, donate_argnums=0)
    state, metrics = step(built.state)
    state, metrics = step(state)
    assert np.isfinite(float(metrics["loss"])) and 0 <= float(metrics["macro_accuracy"]) <= 1
    after = nnx.to_pure_dict(state.params)
    assert any(not np.allclose(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)))


@pytest.mark.parametrize("override, message", [
    (["task=mad_in_context_recall", "task.seq_len=15"], "even"),
    (["task=mad_in_context_recall", "task.frac_noise=0.5"], "noise_vocab_size"),
    (["task=mad_fuzzy_in_context_recall", "task.vocab=6"], "too small"),
    (["task=mad_selective_copying", "task.seq_len=33"], "num_tokens_to_copy"),
    (["task=mad_memorization", "task.seq_len=7"], "even"),
])
def test_bad_settings_name_the_field(override, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose_config(override))


def test_every_mad_task_is_registered():
    assert {n for n in TASKS if n.startswith("mad_")} == set(SMALL)
