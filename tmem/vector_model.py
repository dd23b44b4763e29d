"""The model for vector tasks (in-context regression): a read-in, the shared stack, a read-out.

With the identity read-in the task's tokens enter the residual stream as they
are and the prediction is minus their last coordinate after the last block:
von Oswald's model, where a layer that writes -dW x into the y-slot of the
query predicts W x. The learned read-in and read-out (after the final norm)
are the usual choice for other models, as in Garg et al.
"""

from __future__ import annotations

from flax import nnx

from tmem.backbone import Backbone, final_norm
from tmem.layers import linear
from tmem.schema import Config


class VectorModel(Backbone):
    """A read-in and a read-out around the shared stack (tmem.backbone).

    `model(inputs [B, T, token_dim])` gives one scalar prediction per position
    [B, T]; `positions` [B, Q] gives them only there, and the last block then
    reads only there.
    """

    def __init__(self, cfg: Config, token_dim: int, max_len: int, *, rngs: nnx.Rngs):
        m = cfg.model
        self.identity = m.read_in == "identity"  # validation has resolved auto
        self.read_in = None if self.identity else linear(token_dim, m.width, bias=True, rngs=rngs)
        super().__init__(m, cfg.mixer, cfg.mlp, max_len, rngs=rngs)  # drawn after the read-in, as always
        if not self.identity:
            self.norm = final_norm(m, rngs)
            self.read_out = linear(m.width, 1, bias=True, rngs=rngs)

    def __call__(self, inputs_btd, *, positions=None, head_mask=None, states=None):
        return self.forward(inputs_btd, positions=positions, head_mask=head_mask, states=states)[0]

    def forward(self, inputs_btd, *, positions=None, head_mask=None, states=None):
        """Predictions [B, T] (or [B, Q] at positions) and the final mixer state of every block application."""
        x = inputs_btd if self.read_in is None else self.read_in(inputs_btd)
        x, states = self.stack(x, states=states, head_mask=head_mask, read_at=positions)
        if self.identity:
            return -x[..., -1], states
        return self.read_out(self.norm(x))[..., 0], states
