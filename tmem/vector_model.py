"""The model for vector tasks (in-context regression): a read-in, the LM's blocks, a read-out.

With the identity read-in the task's tokens enter the residual stream as they
are and the prediction is minus their last coordinate after the last block:
von Oswald's model, where a layer that writes -dW x into the y-slot of the
query predicts W x. The learned read-in and read-out (after the final norm)
are the usual choice for other models, as in Garg et al.
"""

from __future__ import annotations

from flax import nnx

from tmem.config import Config, position_scheme, read_in_scheme
from tmem.layers import make_norm
from tmem.model import Block


class VectorModel(nnx.Module):
    """`model(inputs [B, T, token_dim])` gives one scalar prediction per position [B, T];
    `positions` [B, Q] gives them only there, and the last block then reads only there.
    The residual stream after each block is sown as the `residual` intermediate."""

    def __init__(self, cfg: Config, token_dim: int, max_len: int, *, rngs: nnx.Rngs):
        m = cfg.model
        self.depth = m.depth
        self.identity = read_in_scheme(cfg) == "identity"
        self.read_in = None if self.identity else nnx.Linear(token_dim, m.width, rngs=rngs)
        scheme = position_scheme(cfg)
        self.pos_embed = (nnx.Param(nnx.initializers.normal(m.pos_std)(rngs.params(), (max_len, m.width)))
                          if scheme in ("learned", "shortformer") else None)
        self.shortformer = scheme == "shortformer"  # positions enter the queries and keys only
        # Tied: one block looped `depth` times, von Oswald's recurrent model (K steps of one learner).
        self.blocks = nnx.List([Block(cfg, rngs=rngs) for _ in range(1 if m.tie_blocks else m.depth)])
        if not self.identity:
            self.norm = make_norm(m.norm, m.width, rngs)
            self.read_out = nnx.Linear(m.width, 1, rngs=rngs)

    def __call__(self, inputs_btd, *, positions=None, head_mask=None):
        """Predictions [B, T], or [B, Q] at positions. head_mask: [depth, heads] multipliers (0 ablates)."""
        x = inputs_btd if self.read_in is None else self.read_in(inputs_btd)
        qk_positions = None
        if self.pos_embed is not None:
            p = self.pos_embed[...][None, : x.shape[1]]
            qk_positions, x = (p, x) if self.shortformer else (None, x + p)
        for i in range(self.depth):
            block = self.blocks[i % len(self.blocks)]
            x, _ = block(x, head_mask=None if head_mask is None else head_mask[i],
                         read_at=positions if i == self.depth - 1 else None, qk_positions=qk_positions)
            self.sow(nnx.Intermediate, "residual", x, capture_noop=True)
        if self.identity:
            return -x[..., -1]
        return self.read_out(self.norm(x))[..., 0]

