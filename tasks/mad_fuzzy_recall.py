"""MAD's fuzzy in-context recall: keys and values are motifs of 1 to 3 tokens (multi-query), in pure JAX.

One example with vocabulary V = 16 (keys 0-6, values 7-14, 15 pads)::

    sequence  15 15 | 3 5 | 9 | 1 | 12 8 7 | 0 4 6 | 10 | ... | 2 6 | 13 9 | ... | 2 6 | 13 9
              pad     key   val key  value    key     val         the probe pair        the probe, last
    inputs    the first seq_len tokens; targets the next token at every position (MAD's training targets)
    test      the value tokens of keys shown before, and the last probe's value

Keys are ordered tuples of 1..k_motif_size distinct tokens of the key
vocabulary [0, (V-1)/2), values of 1..v_motif_size distinct tokens of
[(V-1)/2, V-1); token V-1 pads. Each pair draws its key's and its value's
size uniformly. Key and value runs alternate, so a key's boundaries are
visible. A key motif keeps its value motif within a sequence.
Pairs are added while the sequence is shorter than seq_len - |probe| -
(k_motif_size + v_motif_size); the probe pair is put in at the first pair
boundary at or after a uniform position, and repeated at the end; the
sequence is left-padded to seq_len + 1 tokens. Training keys have a uniform
size, test keys (`sample_heldout`) always the longest, as in MAD.

Pure JAX with static shapes: every example draws the most pairs it could
need, marks which fit, and scatters their tokens into place. A key repeated
takes the value of its first occurrence, found by comparing keys encoded as
integers.

Where tmem differs from MAD (`generate_fuzzy_in_context_recall_instance`):
MAD sometimes leaves the probe out of the body, when its drawn position falls
after the body's end (the last query is then unanswerable unless the key
recurs by chance); here it goes in at the last pair instead, so every final
query is answerable. Where the probe key occurs by chance before its place,
MAD does not insert it again; here it is inserted. Only multi_query and no
noise (MAD's benchmark setting) are implemented.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from tasks.base import Batch, check
from tasks.mad import MadTask


@dataclasses.dataclass(frozen=True)
class FuzzyInContextRecall(MadTask):
    vocab: int = 16
    seq_len: int = 128
    k_motif_size: int = 3  # the longest key motif
    v_motif_size: int = 3  # the longest value motif
    heldout_size: int = 1280
    heldout_seed: int = 2**31 - 1

    name = "mad_fuzzy_in_context_recall"

    def __post_init__(self):
        keys = (self.vocab - 1) // 2
        check(
            (self.k_motif_size >= 1 and self.v_motif_size >= 1, "task.k_motif_size and task.v_motif_size must be >= 1"),
            (keys >= self.k_motif_size and self.vocab - 1 - keys >= self.v_motif_size,
             "task.vocab too small: a motif is distinct tokens of half of the vocabulary - 1"),
            (self.seq_len > 2 * (self.k_motif_size + self.v_motif_size),
             "task.seq_len must exceed 2 * (task.k_motif_size + task.v_motif_size)"),
            ((keys + 1) ** self.k_motif_size < 2**31, "task.vocab ** task.k_motif_size must stay below 2^31"),
            (self.heldout_size >= 1, "task.heldout_size must be at least 1"),
        )

    def _example(self, key: jax.Array, test: bool = False) -> Batch:
        T, V, km, vm = self.seq_len, self.vocab, self.k_motif_size, self.v_motif_size
        M, pad, K = km + vm, V - 1, (V - 1) // 2  # key tokens [0, K), value tokens [K, V - 1)
        N = (T - 1 - M) // 2  # the most pairs a body can hold: each has 2+ tokens and starts before T - 2 - M
        ks = jax.random.split(key, 9)

        def motifs(k, count, low, high, size):
            """`count` motifs of `size` distinct tokens of [low, high), uniform ordered draws (Gumbel top-k)."""
            return low + jax.lax.top_k(jax.random.gumbel(k, (count, high - low)), size)[1]

        def encode(tokens, size):
            """An integer per key motif, different for every (size, tokens)."""
            place = jnp.arange(km).reshape((1,) * size.ndim + (km,))
            return (jnp.where(place < size[..., None], tokens + 1, 0) * (K + 1) ** place).sum(-1)

        k_size = jnp.full(N, km) if test else jax.random.randint(ks[0], (N,), 1, km + 1)
        v_size = jax.random.randint(ks[1], (N,), 1, vm + 1)
        k_tok, v_tok = motifs(ks[2], N, 0, K, km), motifs(ks[3], N, K, V - 1, vm)
        pk_size = jnp.asarray(km) if test else jax.random.randint(ks[4], (), 1, km + 1)
        pv_size = jax.random.randint(ks[5], (), 1, vm + 1)
        pk, pv = motifs(ks[6], 1, 0, K, km)[0], motifs(ks[7], 1, K, V - 1, vm)[0]
        probe_size = pk_size + pv_size
        probe_at = jax.random.randint(ks[8], (), 0, T - 2 * probe_size)
        stop = T - probe_size - M  # pairs are added while the sequence is shorter than this

        # one value per key motif: the probe's for the probe key, else its first occurrence's
        code, probe_code = encode(k_tok, k_size), encode(pk, pk_size)
        is_probe = code == probe_code
        v_size, v_tok = jnp.where(is_probe, pv_size, v_size), jnp.where(is_probe[:, None], pv[None], v_tok)
        first = jnp.argmax(code[:, None] == code[None, :], 1)
        v_size, v_tok = v_size[first], v_tok[first]

        # the probe replaces the first pair starting at or after probe_at (the last pair that fits, if none)
        size = k_size + v_size
        start = jnp.cumsum(size) - size
        after = start >= probe_at
        last = (start < stop).sum() - 1
        at = jnp.arange(N) == jnp.minimum(jnp.where(after.any(), jnp.argmax(after), N), last)
        k_size, v_size = jnp.where(at, pk_size, k_size), jnp.where(at, pv_size, v_size)
        k_tok, v_tok, code = jnp.where(at[:, None], pk[None], k_tok), jnp.where(at[:, None], pv[None], v_tok), jnp.where(
            at, probe_code, code)
        size = k_size + v_size
        start = jnp.cumsum(size) - size
        fits = start < stop
        body = jnp.where(fits, size, 0).sum()
        repeated = jnp.argmax(code[:, None] == code[None, :], 1) < jnp.arange(N)
        tested = fits & repeated & ~at  # MAD does not score the probe's first insertion

        # every pair's tokens in M slots, scattered after the left padding
        slot = jnp.arange(M)
        in_value = slot[None] >= k_size[:, None]
        v_index = jnp.clip(slot[None] - k_size[:, None], 0, vm - 1)
        tokens = jnp.where(in_value, jnp.take_along_axis(v_tok, v_index, 1),
                           jnp.take_along_axis(k_tok, jnp.broadcast_to(jnp.clip(slot, 0, km - 1), (N, M)), 1))
        used = (slot[None] < size[:, None]) & fits[:, None]
        offset = T + 1 - body - probe_size
        dest = jnp.where(used, offset + start[:, None] + slot[None], T + 1).ravel()  # T + 1: dropped
        sequence = jnp.full(T + 1, pad, jnp.int32).at[dest].set(tokens.ravel(), mode="drop")
        scored = jnp.zeros(T + 1, jnp.float32).at[dest].set((in_value & tested[:, None]).ravel().astype(jnp.float32),
                                                           mode="drop")

        probe_value = slot >= pk_size
        probe_tokens = jnp.where(probe_value, pv[jnp.clip(slot - pk_size, 0, vm - 1)], pk[jnp.clip(slot, 0, km - 1)])
        dest = jnp.where(slot < probe_size, offset + body + slot, T + 1)
        sequence = sequence.at[dest].set(probe_tokens, mode="drop")
        scored = scored.at[dest].set(probe_value.astype(jnp.float32), mode="drop")
        return Batch(inputs=sequence[:T], targets=sequence[1:],
                     mask=scored[1:] if test else jnp.ones(T, jnp.float32))
