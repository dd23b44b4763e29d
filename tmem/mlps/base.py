"""The protocol every MLP obeys (the slow memory: a memory written by training), and the auxiliary losses.

An MLP's config extends `MLPConfig` and says how many parameters it has in
all and how many one token's forward pass uses (`parameters(width)`: the
dense MLP uses all of them, a mixture of experts its chosen experts, a memory
layer its chosen values); its layer is called `y = mlp(x)` on [..., width],
each position on its own. A layer that adds a term to the training loss (the
mixture of experts' load balancing) sows it as an `AuxiliaryLoss`;
`with_auxiliary_losses` collects them around a forward pass.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from flax import nnx


@dataclasses.dataclass(frozen=True)
class MLPConfig:
    """The field every MLP's config has; each kind extends it with its knobs."""

    name: str = "none"

    def check(self, width: int) -> None:
        """Raise ValueError, in one line naming the field, for a knob that does not fit a model of this width."""

    def parameters(self, width: int) -> tuple[int, int]:
        """(active, total): the parameters one token's forward pass uses, and all of them."""
        return 0, 0


class AuxiliaryLoss(nnx.Variable):
    """A term a layer adds to the training loss, sown as (weight, value) under the metric's name.

    Sown only inside `with_auxiliary_losses` (a no-op elsewhere), so a model
    without such a layer trains the program it always did.
    """


def sows_auxiliary_losses(model: nnx.Module) -> bool:
    """Whether any layer of `model` may sow an AuxiliaryLoss (a layer says so with `auxiliary_losses = True`)."""
    return any(getattr(m, "auxiliary_losses", False) for _, m in nnx.iter_graph(model))


def with_auxiliary_losses(forward, model: nnx.Module):
    """(*args) -> (forward(*args), term, metrics): the weighted sum of every AuxiliaryLoss sown during the call,
    and each name's value as a metric, the mean over the layers (and a looped block's applications) that sowed it.

    forward takes `model` first. A model with no such layer is called as it is, with no term (None) and no
    metrics: its program is what it was. One with such a layer runs under `nnx.capture`, which also turns off
    softmax attention's fused read (tmem.mixers.attention keeps the plain read while anything is captured).
    """
    if not sows_auxiliary_losses(model):
        return lambda *args: (forward(model, *args), None, {})

    def call(*args):
        out, sown = nnx.capture(forward, AuxiliaryLoss)(model, *args)
        pairs: dict[str, list] = {}
        for path, sown_here in nnx.to_flat_state(sown):  # one variable per layer: a tuple, one pair a call
            for weight, value in sown_here.get_value():
                pairs.setdefault(path[-1], []).append((weight, value))
        term = sum(w * v for ps in pairs.values() for w, v in ps)
        metrics = {name: jnp.mean(jnp.stack([v for _, v in ps])) for name, ps in pairs.items()}
        return out, jnp.asarray(term, jnp.float32), metrics

    return call
