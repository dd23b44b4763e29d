"""The MQAR distance probe on a model whose recall depends on distance in a known way."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tasks import MQAR, heldout
from tmem.probes.mqar_distance import recall_by_distance


def near_sighted(inputs, *, positions, kv=4, vocab=256, reach=8):
    """Looks each query's key up in the context, but answers only when it is under `reach` tokens back."""
    query = jnp.take_along_axis(inputs, positions, axis=1)  # [B, Q]
    keys, values = inputs[:, 0:2 * kv:2], inputs[:, 1:2 * kv:2]
    j = jnp.argmax(keys[:, None, :] == query[..., None], axis=-1)
    value = jnp.take_along_axis(values, j, axis=1)
    guess = jnp.where(positions - 2 * j < reach, value, 0)
    return 10.0 * jax.nn.one_hot(guess, vocab)


@pytest.mark.slow  # 3 s from a cold cache
def test_bins_report_the_known_cutoff():
    batch = heldout(MQAR(heldout_size=300))
    rows = recall_by_distance(near_sighted, batch, chunk=128)
    for low, acc, n in zip(rows["distance_low"], rows["accuracy"], rows["count"]):
        assert n > 0
        assert acc == (1.0 if low < 8 else 0.0)
    assert sum(rows["count"]) == 300 * 4
    near = np.asarray(batch.meta["distance"]) < 8
    np.testing.assert_allclose(rows["overall_accuracy"], near.mean())
