"""The language model: embedding, N pre-norm blocks, unembedding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from tmem.config import Config, position_scheme
from tmem.layers import MLP, make_norm
from tmem.mixers import MIXERS


class Fixed(nnx.Variable):
    """A weight training does not change: not an nnx.Param, so the optimizer never sees it."""


class Block(nnx.Module):
    """x += mixer(norm x); x += mlp(norm x). The mixer is the fast memory, the MLP the slow one."""

    def __init__(self, cfg: Config, *, rngs: nnx.Rngs):
        width = cfg.model.width
        _, mixer_cls = MIXERS[cfg.mixer.name]
        self.mixer_norm = make_norm(cfg.model.norm, width, rngs)
        self.mixer = mixer_cls(cfg.mixer, width, rope=position_scheme(cfg) == "rope", rngs=rngs)
        if cfg.mlp.name != "none":
            self.mlp_norm = make_norm(cfg.model.norm, width, rngs)
            hidden = int(round(cfg.mlp.expansion * width))
            self.mlp = MLP(width, hidden, cfg.mlp.name, bias=cfg.mlp.bias, rngs=rngs)
        else:
            self.mlp = None

    def __call__(self, x_btd, *, state=None, head_mask=None, read_at=None, qk_positions=None):
        """With read_at [B, Q], the block's output only at those positions (see the mixer)."""
        # Only mixers that declare takes_qk_positions get the keyword (config validation checks it).
        extra = {} if qk_positions is None else {"qk_positions": qk_positions}
        y, state = self.mixer(self.mixer_norm(x_btd), state=state, head_mask=head_mask, read_at=read_at, **extra)
        if read_at is not None:
            x_btd = jnp.take_along_axis(x_btd, read_at[..., None], axis=1)
        x_btd = x_btd + y
        if self.mlp is not None:
            x_btd = x_btd + self.mlp(self.mlp_norm(x_btd))
        return x_btd, state


class LM(nnx.Module):
    """Token model. `model(tokens)` gives logits at every position; `positions`
    [B, Q] gives them only there, and the last block then reads only there.
    The residual stream after each block is sown as the `residual` intermediate."""

    def __init__(self, cfg: Config, vocab_size: int, max_len: int, *, rngs: nnx.Rngs):
        m = cfg.model
        self.embed = nnx.Embed(vocab_size, m.width, embedding_init=nnx.initializers.normal(m.embed_std), rngs=rngs)
        scheme = position_scheme(cfg)
        self.pos_embed = (nnx.Param(nnx.initializers.normal(m.pos_std)(rngs.params(), (max_len, m.width)))
                          if scheme in ("learned", "shortformer") else None)
        # Shortformer: the same table is added to every mixer's query and key inputs, never to the
        # residual stream, so later layers cannot read position from what earlier ones wrote.
        self.shortformer = scheme == "shortformer"
        self.blocks = nnx.List([Block(cfg, rngs=rngs) for _ in range(m.depth)])
        self.norm = make_norm(m.norm, m.width, rngs)
        self.unembed = None if m.tie_embeddings else nnx.Linear(m.width, vocab_size, use_bias=False, rngs=rngs)
        if not m.train_embeddings:
            # Random fixed token codes: whatever the model stores must then live in its blocks.
            self.embed.embedding = Fixed(self.embed.embedding[...])
            if self.unembed is not None:
                self.unembed.kernel = Fixed(self.unembed.kernel[...])

    def __call__(self, tokens_bt, *, positions=None, head_mask=None, states=None):
        logits, _ = self.forward(tokens_bt, positions=positions, head_mask=head_mask, states=states)
        return logits

    def forward(self, tokens_bt, *, positions=None, head_mask=None, states=None):
        """Logits and every block's final mixer state.

        head_mask: [depth, heads] multipliers of each head's read-out (0 ablates);
        states: per-block initial mixer states, to continue an earlier call.
        """
        x = self.embed(tokens_bt)
        qk_positions = None
        if self.pos_embed is not None:
            T = tokens_bt.shape[1]
            offset = 0 if states is None else _state_len(states[0])
            p = jax.lax.dynamic_slice_in_dim(self.pos_embed[...], offset, T)[None]
            if self.shortformer:
                qk_positions = p
            else:
                x = x + p
        finals = []
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            # Only the scored positions need the last block's reads.
            x, state = block(x, state=None if states is None else states[i],
                             head_mask=None if head_mask is None else head_mask[i],
                             read_at=positions if i == last else None, qk_positions=qk_positions)
            self.sow(nnx.Intermediate, "residual", x, capture_noop=True)
            finals.append(state)
        x = self.norm(x)
        logits = self.embed.attend(x) if self.unembed is None else self.unembed(x)
        return logits, finals


def _state_len(state) -> int:
    """Tokens an earlier call read: a fixed-size state counts them, a cache has them on axis 1."""
    length = getattr(state, "length", None)
    return length if length is not None else jax.tree.leaves(state)[0].shape[1]


def build_model(cfg: Config, task, seed: int | None = None) -> nnx.Module:
    """The model a config describes, for the task it will read: an LM, or a VectorModel for vectors."""
    seed = cfg.train.seed if seed is None else seed
    if task.input_kind == "vectors":
        from tmem.vector_model import VectorModel  # it builds on this module's Block

        return VectorModel(cfg, task.token_dim, task.seq_len, rngs=nnx.Rngs(params=seed))
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
