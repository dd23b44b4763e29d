"""The stack every model shares: positions and blocks, continued from one state per block application."""

from __future__ import annotations

import jax
from flax import nnx

from tmem.layers import make_norm
from tmem.mixers import MixerConfig, MixerState, layer_of
from tmem.mixers.base import at_positions
from tmem.mlps import MLPConfig, layer_of as mlp_layer
from tmem.schema import ModelConfig


class Block(nnx.Module):
    """x += mixer(norm x); x += mlp(norm x), or with post-norm x = norm(x + mixer(x)); x = norm(x + mlp(x)).

    The mixer is the fast memory, the MLP (any of tmem.mlps, or none) the slow one.
    """

    def __init__(self, width: int, *, norm: str, mixer: MixerConfig, mlp: MLPConfig, positions: str,
                 rngs: nnx.Rngs, post_norm: bool = False):
        self.post_norm = post_norm
        # shortformer positions reach only a mixer with query and key inputs (in a hybrid, not every layer's has)
        self.takes_qk_positions = mixer.takes_qk_positions
        self.mixer_norm = make_norm(norm, width, rngs)
        # RoPE rotates the layers that apply it (a hybrid may have others, which would refuse it)
        self.mixer = layer_of(mixer)(mixer, width, rope=positions == "rope" and mixer.applies_rope, rngs=rngs)
        layer = mlp_layer(mlp)
        if layer is not None:
            self.mlp_norm = make_norm(norm, width, rngs)
            self.mlp = layer(mlp, width, rngs=rngs)
        else:
            self.mlp = None

    def __call__(self, x_btd, *, state=None, head_mask=None, read_at=None, qk_positions=None):
        """With read_at [B, Q], the block's output only at those positions (the mixer reads only there)."""
        qk_positions = qk_positions if self.takes_qk_positions else None
        if self.post_norm:
            y, state = self.mixer(x_btd, state=state, head_mask=head_mask, read_at=read_at,
                                  qk_positions=qk_positions)
            x_btd = self.mixer_norm(at_positions(x_btd, read_at) + y)
            if self.mlp is not None:
                x_btd = self.mlp_norm(x_btd + self.mlp(x_btd))
            return x_btd, state
        y, state = self.mixer(self.mixer_norm(x_btd), state=state, head_mask=head_mask, read_at=read_at,
                              qk_positions=qk_positions)
        x_btd = at_positions(x_btd, read_at) + y
        if self.mlp is not None:
            x_btd = x_btd + self.mlp(self.mlp_norm(x_btd))
        return x_btd, state


def final_norm(model: ModelConfig, rngs: nnx.Rngs):
    """The norm before a head. Post-norm has none: every block already ends in a norm, and a second one
    straight after it would only renormalise what is normalised (the original Transformer has none either)."""
    return make_norm("none" if model.norm_position == "post" else model.norm, model.width, rngs)


class Backbone(nnx.Module):
    """A position table and `depth` applications of the blocks; the token and vector models are heads on it.

    A learned table is added to the residual stream; shortformer's is added only
    to every mixer's query and key inputs, so later layers cannot read position
    from what earlier ones wrote. With tie_blocks one block is applied `depth`
    times (a looped model), each application keeping a state of its own. A
    hybrid (model.mixers) gives each block its entry of the pattern, cycled over
    the depth; tied, one block per entry, the pattern looped. The residual
    stream after each application is sown as the `residual` intermediate.
    """

    def __init__(self, model: ModelConfig, mixer: MixerConfig, mlp: MLPConfig, max_len: int, *, rngs: nnx.Rngs):
        self.depth, self.positions = model.depth, model.positions  # positions: resolved by validation, never auto
        self.pos_embed = (nnx.Param(nnx.initializers.normal(model.pos_std)(rngs.params(), (max_len, model.width)))
                          if self.positions in ("learned", "shortformer") else None)
        parts = dict(norm=model.norm, mlp=mlp, positions=self.positions, post_norm=model.norm_position == "post")
        self.blocks = nnx.List([Block(model.width, mixer=layer, **parts, rngs=rngs)
                                for layer in model.layer_mixers(mixer)])

    @property
    def head_counts(self) -> tuple[int, ...]:
        """Each application's head count, the length of its head mask (None for a layer without heads)."""
        layers = [getattr(self.blocks[i % len(self.blocks)].mixer, "cfg", None) for i in range(self.depth)]
        return tuple(getattr(layer, "heads", None) for layer in layers)

    def stack(self, x_btd: jax.Array, *, states: list[MixerState] | None = None, head_mask=None, read_at=None):
        """The residual stream after the last application, and each application's final mixer state.

        states: one per application, from an earlier call, to continue it (its
        positions start at the states' token count). head_mask [depth, heads]:
        multipliers of each head's read (0 ablates); a hybrid whose layers have
        different head counts takes a list, one [heads] per application
        (`head_counts`). read_at [B, Q]: the last
        application reads only there, all the loss needs when it scores a few positions.
        """
        if states is not None and len(states) != self.depth:
            raise ValueError(f"states: one per application of a block is needed ({self.depth}), got {len(states)}")
        offset = 0 if states is None else states[0].length
        qk_positions = None
        if self.pos_embed is not None:
            table, T = self.pos_embed[...], x_btd.shape[1]
            if offset + T > table.shape[0]:
                raise ValueError(f"tokens {offset} to {offset + T} run past the learned position table's "
                                 f"{table.shape[0]}: continue within the training length, or use "
                                 "model.positions=rope or none")
            p = table[None, offset:offset + T]
            if self.positions == "shortformer":
                qk_positions = p
            else:
                x_btd = x_btd + p
        finals = []
        for i in range(self.depth):
            x_btd, state = self.blocks[i % len(self.blocks)](
                x_btd, state=None if states is None else states[i],
                head_mask=None if head_mask is None else head_mask[i],
                read_at=read_at if i == self.depth - 1 else None, qk_positions=qk_positions)
            self.sow(nnx.Intermediate, "residual", x_btd, capture_noop=True)
            finals.append(state)
        return x_btd, finals
