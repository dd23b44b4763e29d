"""The token model (LM), the model a config builds, and hand-set weights."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from tmem.autoencoder import AutoEncoder
from tmem.backbone import Backbone, final_norm
from tmem.layers import Fixed, linear
from tmem.schema import Config
from tmem.vector_model import VectorModel


class LM(Backbone):
    """Token model: an embedding and an unembedding around the shared stack (tmem.backbone).

    `model(tokens)` gives logits at every position; `positions` [B, Q] gives
    them only there, and the last block then reads only there.
    """

    def __init__(self, cfg: Config, vocab_size: int, max_len: int, *, rngs: nnx.Rngs):
        m = cfg.model
        self.embed = nnx.Embed(vocab_size, m.width, embedding_init=nnx.initializers.normal(m.embed_std), rngs=rngs)
        # the stack's parameters are drawn after the embedding's: the order of draws is the initialisation
        super().__init__(m, cfg.mixer, cfg.mlp, max_len, rngs=rngs)
        self.norm = final_norm(m, rngs)
        self.unembed = None if m.tie_embeddings else linear(m.width, vocab_size, bias=False, rngs=rngs)
        if not m.train_embeddings:
            # Random fixed token codes: whatever the model stores must then live in its blocks.
            self.embed.embedding = Fixed(self.embed.embedding[...])
            if self.unembed is not None:
                self.unembed.kernel = Fixed(self.unembed.kernel[...])

    def __call__(self, tokens_bt, *, positions=None, head_mask=None, states=None):
        return self.forward(tokens_bt, positions=positions, head_mask=head_mask, states=states)[0]

    def forward(self, tokens_bt, *, positions=None, head_mask=None, states=None):
        """Logits and the final mixer state of every block application (see Backbone.stack)."""
        return self.forward_codes(self.embed(tokens_bt), positions=positions, head_mask=head_mask, states=states)

    def forward_codes(self, x_btd, *, positions=None, head_mask=None, states=None):
        """`forward` from the tokens' codes (embedding rows) [B, T, D]: a probe can move a token's code off its
        row, a rephrased query (tmem.probes.rephrasing)."""
        x, states = self.stack(x_btd, states=states, head_mask=head_mask, read_at=positions)
        x = self.norm(x)
        return (self.embed.attend(x) if self.unembed is None else self.unembed(x)), states


def build_model(cfg: Config, task, seed: int | None = None) -> nnx.Module:
    """The model a config describes, for the task it will read: an LM, a VectorModel for vectors, or an
    AutoEncoder for a task with `head = "autoencoder"`."""
    seed = cfg.train.seed if seed is None else seed
    if task.input_kind == "vectors":
        return VectorModel(cfg, task.token_dim, task.seq_len, rngs=nnx.Rngs(params=seed))
    if getattr(task, "head", None) == "autoencoder":  # MAD's compression task
        return AutoEncoder(cfg, task.vocab_size, task.seq_len, rngs=nnx.Rngs(params=seed))
    return LM(cfg, task.vocab_size, task.seq_len, rngs=nnx.Rngs(params=seed))


def count_params(model: nnx.Module) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def load_weights(model: nnx.Module, weights: dict) -> None:
    """Set some of a model's parameters from a nested dict of arrays (hand-built weights).

    Paths follow `nnx.to_pure_dict(nnx.state(model, nnx.Param))`, e.g.
    {"blocks": {0: {"mixer": {"qkv": {"kernel": W}}}}}. Unknown paths and shape
    changes are errors, so a typo cannot silently leave a weight untouched.
    """
    current = nnx.to_pure_dict(nnx.state(model, nnx.Param))

    def merge(cur, new, path):
        out = dict(cur)
        for k, v in new.items():
            if k not in cur:
                raise KeyError(f"no parameter {'/'.join(map(str, path + [k]))}; have {sorted(map(str, cur))}")
            if isinstance(v, dict):
                out[k] = merge(cur[k], v, path + [k])
            else:
                v = jnp.asarray(v, cur[k].dtype)
                if v.shape != cur[k].shape:
                    raise ValueError(f"{'/'.join(map(str, path + [k]))}: shape {v.shape}, expected {cur[k].shape}")
                out[k] = v
        return out

    state = nnx.state(model, nnx.Param)
    nnx.replace_by_pure_dict(state, merge(current, weights, []))
    nnx.update(model, state)
