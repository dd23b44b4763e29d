"""Per-head attention scores on repeated random tokens (Olsson et al. 2022; anchors/induction.md 1.1-1.3).

The probe input is [BOS] + R + R with R drawn without replacement, so every
token of the second copy has exactly one earlier occurrence. With period L,
position 0 holds BOS, the first copy fills 1..L and the second L+1..2L. A query
q in the second copy finds its token's earlier occurrence at q - L and the
token after it at q - L + 1. Attention patterns are [depth, B, H, T, S], as
the softmax mixer sows them (one [B, H, T, S] per block).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

BOS = 0  # tasks.repeat.BOS; probes read token 0 as the start of every sequence


def repeated_tokens(key: jax.Array, batch: int, vocab: int, period: int) -> jax.Array:
    """[batch, 2 * period + 1] int32: BOS, then R, then R again; R distinct tokens from 1..vocab-1."""
    if not 1 <= period <= vocab - 1:
        raise ValueError(f"period {period} needs 1 <= period <= vocab - 1 = {vocab - 1} distinct tokens")
    keys = jax.random.split(key, batch)
    R = jax.vmap(lambda k: 1 + jax.lax.top_k(jax.random.gumbel(k, (vocab - 1,)), period)[1])(keys)
    bos = jnp.full((batch, 1), BOS, R.dtype)
    return jnp.concatenate([bos, R, R], axis=1).astype(jnp.int32)


def second_copy(period: int) -> np.ndarray:
    """Query positions of the second copy."""
    return np.arange(period + 1, 2 * period + 1)


def induction_score(A: jax.Array, period: int) -> jax.Array:
    """Prefix matching: mean attention from each second-copy query to the token after its earlier occurrence.

    A: [..., B, H, T, S] -> [..., H]. A perfect induction head scores 1, chance is about 1/q.
    """
    q = second_copy(period)
    return A[..., q, q - period + 1].mean(axis=(-3, -1))


def duplicate_score(A: jax.Array, period: int) -> jax.Array:
    """Mean attention from each second-copy query to the earlier occurrence of its own token."""
    q = second_copy(period)
    return A[..., q, q - period].mean(axis=(-3, -1))


def previous_token_score(A: jax.Array) -> jax.Array:
    """Mean attention from each position t >= 1 to t - 1 (any text works; here the repeated tokens)."""
    t = np.arange(1, A.shape[-2])
    return A[..., t, t - 1].mean(axis=(-3, -1))


def token_losses(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """[B, T-1] cross-entropy of predicting tokens[t + 1] from position t."""
    return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:])


def copy_losses(logits: jax.Array, tokens: jax.Array, period: int) -> dict[str, float]:
    """Mean loss on the second copy against the first, both without their first token.

    A copy's first token cannot be predicted from context (nothing says where a
    repeat begins), so second-copy positions L+1..2L-1 (predicting L+2..2L) face
    first-copy positions 1..L-1 (predicting 2..L), as TransformerLens's induction_loss.
    """
    ce = token_losses(logits, tokens)
    first, second = np.arange(1, period), np.arange(period + 1, 2 * period)
    return {"first_copy_loss": float(ce[:, first].mean()), "second_copy_loss": float(ce[:, second].mean())}


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, tokens, head_mask):
    model = nnx.merge(graphdef, state)
    logits, inter = nnx.capture(model, nnx.Intermediate)(tokens, head_mask=head_mask)
    A = jnp.stack([block["mixer"]["attention"][0] for block in inter["blocks"].values()])
    return logits, A


def forward_with_attention(model, tokens: jax.Array, head_mask: jax.Array | None = None):
    """(logits [B, T, V], attention [depth, B, H, T, T]) over the full sequence.

    Compiled once per model structure and input shape, so the same call over
    many checkpoints or head masks reuses one program.
    """
    graphdef, state = nnx.split(model)
    if head_mask is None:
        head_mask = jnp.ones((len(model.blocks), model.blocks[0].mixer.heads), jnp.float32)
    return _forward(graphdef, state, tokens, head_mask)


def head_scores(model, probes: dict[int, jax.Array], head_mask: jax.Array | None = None) -> dict:
    """Every per-head score and the copy losses, per period; probes: {period: repeated tokens}.

    Per-head scores are [depth, heads] numpy arrays; `induction` is also averaged over periods.
    """
    # One forward pass for all periods: shorter probes are padded at the end, which a causal
    # model cannot see from the positions that are scored, and one program serves every call.
    T = max(tokens.shape[1] for tokens in probes.values())
    padded = jnp.concatenate([jnp.pad(tokens, ((0, 0), (0, T - tokens.shape[1]))) for tokens in probes.values()])
    all_logits, all_A = forward_with_attention(model, padded, head_mask)
    by_period, start = {}, 0
    for period, tokens in probes.items():
        B, t = tokens.shape
        logits, A = all_logits[start:start + B, :t], all_A[:, start:start + B, :, :t, :t]
        start += B
        by_period[period] = {
            "induction": np.asarray(induction_score(A, period)),
            "duplicate": np.asarray(duplicate_score(A, period)),
            "previous_token": np.asarray(previous_token_score(A)),
            **copy_losses(logits, tokens, period),
        }
    mean = lambda name: np.mean([s[name] for s in by_period.values()], axis=0)  # noqa: E731
    return {"by_period": by_period, **{name: mean(name) for name in
                                       ("induction", "duplicate", "previous_token", "first_copy_loss",
                                        "second_copy_loss")}}
