"""Per-head attention scores on hand-built attention patterns with known answers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tmem.probes.heads import (copy_losses, duplicate_score, induction_score, previous_token_score,
                               repeated_tokens)

L = 6
T = 2 * L + 1


def pattern(offset: int) -> np.ndarray:
    """[1, 1, T, T]: every query attends to key q - offset where it exists, else to BOS."""
    A = np.zeros((T, T))
    for q in range(T):
        A[q, q - offset if q - offset >= 0 else 0] = 1.0
    return A[None, None]


def test_repeated_tokens_are_bos_then_a_distinct_segment_twice():
    x = np.asarray(repeated_tokens(jax.random.key(0), 50, 16, L))
    assert x.shape == (50, T) and (x[:, 0] == 0).all()
    np.testing.assert_array_equal(x[:, 1:L + 1], x[:, L + 1:])
    assert all(len(set(r[1:L + 1])) == L for r in x) and (x[:, 1:] >= 1).all() and (x < 16).all()
    with pytest.raises(ValueError, match="distinct tokens"):
        repeated_tokens(jax.random.key(0), 2, 8, 8)


@pytest.mark.parametrize("offset, expected", [
    # query 1, with no key `offset` back, parks on BOS, which is also its previous token
    (L - 1, {"induction": 1.0, "duplicate": 0.0, "previous": 1 / (T - 1)}),  # after the earlier occurrence
    (L, {"induction": 0.0, "duplicate": 1.0, "previous": 1 / (T - 1)}),  # the earlier occurrence itself
    (1, {"induction": 0.0, "duplicate": 0.0, "previous": 1.0}),  # the previous token
])
def test_scores_of_pure_patterns(offset, expected):
    A = jnp.asarray(pattern(offset))
    assert float(induction_score(A, L)[0]) == expected["induction"]
    assert float(duplicate_score(A, L)[0]) == expected["duplicate"]
    assert float(previous_token_score(A)[0]) == pytest.approx(expected["previous"], rel=1e-6)


def test_uniform_attention_scores_chance_and_heads_stay_apart():
    uniform = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    A = jnp.asarray(np.stack([uniform, pattern(L - 1)[0, 0]])[None])  # [B=1, H=2, T, T]
    q = np.arange(L + 1, 2 * L + 1)
    np.testing.assert_allclose(induction_score(A, L), [np.mean(1 / (q + 1)), 1.0], rtol=1e-6)
    # a batch of two examples averages
    half = jnp.concatenate([A, jnp.asarray(pattern(L)[None, 0].repeat(2, 1))], axis=0)
    np.testing.assert_allclose(induction_score(half, L)[1], 0.5, rtol=1e-6)


def test_copy_losses_split_first_and_second_copy():
    x = repeated_tokens(jax.random.key(1), 4, 16, L)
    # logits right with margin 30 at second-copy positions L+1..2L-1, uniform elsewhere
    logits = np.zeros((4, T, 16))
    for t in range(L + 1, 2 * L):
        logits[np.arange(4), t, np.asarray(x[:, t + 1])] = 30.0
    losses = copy_losses(jnp.asarray(logits), x, L)
    assert losses["second_copy_loss"] < 1e-6
    np.testing.assert_allclose(losses["first_copy_loss"], np.log(16), rtol=1e-6)
