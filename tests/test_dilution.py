"""The dilution probe on a model whose recall depends on the distractor in a known way."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tasks import MQAR, heldout
from tmem.probes.dilution import most_distractor_pairs, pair_weight, recall_by_distractor


def reaches(reach: int, vocab: int = 256):
    """Looks each query's key up among the context's keys (every even position before the first query) and
    answers with the token after it, but only when the key is under `reach` tokens back: a memory whose
    recall depends on age alone, so a distractor placed after the queried pairs costs it exactly the pairs it
    pushes past `reach`."""

    def model(inputs, *, positions):
        context = positions.min(axis=1, keepdims=True)  # the first query: everything before it is pairs
        query = jnp.take_along_axis(inputs, positions, axis=1)  # [B, Q]
        keys = jnp.where(jnp.arange(0, inputs.shape[1], 2)[None] < context, inputs[:, 0::2], -1)
        j = jnp.argmax(keys[:, None, :] == query[..., None], axis=-1)
        value = jnp.take_along_axis(inputs[:, 1::2], j, axis=1)
        return 10.0 * jax.nn.one_hot(jnp.where(positions - 2 * j < reach, value, 0), vocab)

    return model


@pytest.mark.slow  # 3 to 5 s on the loaded machine: four held-out sets
def test_recall_falls_as_the_known_reach_predicts():
    task = MQAR(num_kv_pairs=4, heldout_size=200)
    assert most_distractor_pairs(task) == 24  # 8 + 2 * 24 + 8 = 64 tokens
    pairs = [0, 24]
    rows = recall_by_distractor(reaches(24), task, pairs, chunk=200)
    assert rows["distractor_tokens"] == [0, 48]
    for place in ("before", "after"):
        diluted = [dataclasses.replace(task, distractor_pairs=m, distractor_place=place) for m in pairs]
        expected = [(np.asarray(heldout(t).meta["distance"]) < 24).mean() for t in diluted]
        np.testing.assert_allclose(rows[place], expected)
    assert rows["after"][-1] == 0.0 < rows["before"][-1]  # 48 distractor tokens after: every pair past reach


def test_pair_weight_is_the_best_last_layer_heads_weight_on_the_key_and_the_value_after_it():
    A = np.zeros((2, 1, 2, 6, 6))  # [depth, B, H, T, S]
    A[0, 0, :, 5, 2] = 1.0  # the first layer is not read
    A[1, 0, 0, 5, [2, 3, 4]] = 0.3, 0.4, 0.3  # head 0: 0.7 on the pair (key at 2, value at 3)
    A[1, 0, 1, 5, 0] = 1.0  # head 1 reads elsewhere
    A[1, 0, 1, 4, [1, 2]] = 0.5  # the second query (4, key at 1): head 1 puts 1.0 on its pair
    assert pair_weight(A, np.array([[5, 4]]), np.array([[3, 3]])) == pytest.approx((0.7 + 1.0) / 2)
