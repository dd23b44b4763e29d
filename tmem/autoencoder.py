"""The autoencoder MAD's compression task needs: the shared stack as encoder, an MLP decoder of one vector.

MAD's `AutoEncoder` (athms/mad-lab) reads the sequence with the layers under
test and keeps only the output at the last position (its default pooling),
the encoding. The decoder adds a sinusoidal embedding of each output position
to the encoding and maps it through norm, linear, GELU, norm, linear, GELU,
norm and a linear unembedding with a bias, the same small MLP at every
position. Every token must therefore be rebuilt from one vector of the model
width: what the layers can pack into it is what the task measures.

Here the encoder is tmem's Backbone with the run's mixer, MLP, positions and
norm (its last block reads only the last position), and the decoder's norms
are `model.norm`. Where this differs from MAD: MAD's norms are RMSNorm and
its weights start at N(0, 0.02); here they follow the model config and
Flax's initialisers, as in the LM.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from tmem.backbone import Backbone
from tmem.layers import linear, make_norm
from tmem.schema import Config


def sinusoids(length: int, width: int) -> jax.Array:
    """[length, width]: sines then cosines of position times geometric frequencies from 1 to 1/10000."""
    half = width // 2
    rate = jnp.exp(-math.log(10_000.0) / max(half - 1, 1) * jnp.arange(half, dtype=jnp.float32))
    angle = jnp.arange(length, dtype=jnp.float32)[:, None] * rate[None]
    table = jnp.concatenate([jnp.sin(angle), jnp.cos(angle)], 1)
    return jnp.pad(table, ((0, 0), (0, width - 2 * half)))


class AutoEncoder(Backbone):
    """`model(tokens [B, T])` gives logits [B, T, V] of every token, decoded from the last position's output."""

    def __init__(self, cfg: Config, vocab_size: int, max_len: int, *, rngs: nnx.Rngs):
        m = cfg.model
        self.embed = nnx.Embed(vocab_size, m.width, embedding_init=nnx.initializers.normal(m.embed_std), rngs=rngs)
        super().__init__(m, cfg.mixer, cfg.mlp, max_len, rngs=rngs)
        self.decoder = nnx.List([make_norm(m.norm, m.width, rngs), linear(m.width, m.width, bias=True, rngs=rngs),
                                 make_norm(m.norm, m.width, rngs), linear(m.width, m.width, bias=True, rngs=rngs),
                                 make_norm(m.norm, m.width, rngs)])
        self.unembed = linear(m.width, vocab_size, bias=True, rngs=rngs)

    def __call__(self, tokens_bt, *, positions=None, head_mask=None, states=None):
        if states is not None:
            raise ValueError("the autoencoder reads whole sequences: it has no states to continue from")
        B, T = tokens_bt.shape
        last = jnp.full((B, 1), T - 1, jnp.int32)
        encoding, _ = self.stack(self.embed(tokens_bt), head_mask=head_mask, read_at=last)  # [B, 1, D]
        x = encoding + sinusoids(T, encoding.shape[-1])[None]
        norm1, lin1, norm2, lin2, norm3 = self.decoder
        x = jax.nn.gelu(lin1(norm1(x)), approximate=False)
        x = jax.nn.gelu(lin2(norm2(x)), approximate=False)
        logits = self.unembed(norm3(x))
        return logits if positions is None else jnp.take_along_axis(logits, positions[..., None], 1)
