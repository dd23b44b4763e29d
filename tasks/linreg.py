"""In-context linear regression (von Oswald et al. 2023; Garg et al. 2022).

Each example is a fresh task: a teacher w ~ N(0, I_d), inputs x_1..x_N and a
query x_q, labels y = w.x (+ noise). The model sees the N pairs and x_q and
must predict y_q. Two prompt formats, both of width d + 1:

    vonoswald  [x_1, y_1] ... [x_N, y_N] [x_q, 0]            N + 1 tokens
    garg       [x_1, 0] [0, y_1] ... [x_N, 0] [0, y_N] [x_q, 0]   2N + 1 tokens

The von Oswald prompt is a set with the query last: a model may read it
non-causally (mixer.layout=prompt). The Garg prompt is read causally, and with
score=every the model predicts y_i at every x token from the pairs before it,
as Garg et al. train. Inputs follow von Oswald's code, x ~ U(-r/2, r/2)^d with
r = input_range = 1 (the paper's text says U(-1, 1), its numbers match the
code); the loss is half the mean squared error, the convention behind the
published numbers (1-step GD about 0.207 and the zero predictor about 0.417 at
d = N = 10).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from tasks.base import Batch, Options, check


@dataclasses.dataclass(frozen=True)
class LinReg(Options):
    dim: int = 10  # d, the size of x
    num_examples: int = 10  # N in-context pairs before the query
    input_dist: str = "uniform"  # uniform: x ~ U(-r/2, r/2)^d; normal: x ~ N(0, r^2 I) (Garg)
    input_range: float = 1.0  # r; the probe scales it to test beyond the training range
    noise_std: float = 0.0  # label noise sigma on every y, the query's included
    format: str = "vonoswald"  # vonoswald | garg (see the module docstring)
    score: str = "query"  # query | every (garg only: y_i predicted at every x token)
    heldout_size: int = 10000
    heldout_seed: int = 2**31 - 1

    name = "linreg"
    input_kind = "vectors"
    target_metric = "loss"  # train.target applies to eval/loss, lower is better
    default_target = None  # no loss means solved: train the whole schedule
    higher_is_better = False

    def __post_init__(self):
        check(
            (self.dim >= 1 and self.num_examples >= 1, "task.dim and task.num_examples must be positive"),
            (self.heldout_size >= 1, "task.heldout_size must be at least 1"),
            (self.input_dist in ("uniform", "normal"), "task.input_dist must be uniform or normal"),
            (self.input_range > 0, "task.input_range must be positive"),
            (self.noise_std >= 0, "task.noise_std must be non-negative"),
            (self.format in ("vonoswald", "garg"), "task.format must be vonoswald or garg"),
            (self.score in ("query", "every"), "task.score must be query or every"),
            (self.score == "query" or self.format == "garg",
             "task.score=every needs task.format=garg: in the von Oswald prompt every pair shows its own label"),
        )

    @property
    def token_dim(self) -> int:
        """The size of one input vector: x and the y-slot."""
        return self.dim + 1

    @property
    def vocab_size(self) -> None:
        return None  # vector inputs: no vocabulary

    @property
    def seq_len(self) -> int:
        n = self.num_examples
        return n + 1 if self.format == "vonoswald" else 2 * n + 1

    @property
    def layout(self) -> str:
        """prompt: a set read all at once with the query last; causal: read left to right."""
        return "prompt" if self.format == "vonoswald" else "causal"

    def sample(self, key: jax.Array, batch_size: int) -> Batch:
        """A batch of fresh regression tasks; meta holds x [B, N+1, d], y [B, N+1] and w [B, d]."""
        d, n, r = self.dim, self.num_examples, self.input_range
        k_w, k_x, k_noise = jax.random.split(key, 3)
        w = jax.random.normal(k_w, (batch_size, d))
        if self.input_dist == "uniform":
            # r * (u - 1/2), so changing r scales the same draws (the probe's out-of-range inputs)
            x = r * (jax.random.uniform(k_x, (batch_size, n + 1, d)) - 0.5)
        else:
            x = r * jax.random.normal(k_x, (batch_size, n + 1, d))
        y = jnp.einsum("bnd,bd->bn", x, w) + self.noise_std * jax.random.normal(k_noise, (batch_size, n + 1))
        inputs, positions = self.prompt(x, y)
        targets = y if self.score == "every" else y[:, -1:]
        return Batch(inputs=inputs, targets=targets, mask=jnp.ones(targets.shape, jnp.float32),
                     positions=positions, meta={"x": x, "y": y, "w": w})

    def prompt(self, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Tokens [B, T, d+1] and the scored positions [B, Q] from x [B, N+1, d] and y [B, N+1].

        The last pair is the query: its label never enters the tokens. A
        differentiable function of x, so a probe can take gradients with respect
        to the query.
        """
        B, n = x.shape[0], self.num_examples
        y_slot = y.at[:, -1].set(0.0)[..., None]
        if self.format == "vonoswald":
            inputs = jnp.concatenate([x, y_slot], -1)
            positions = jnp.full((B, 1), n, jnp.int32)
            return inputs, positions
        x_tokens = jnp.concatenate([x, jnp.zeros_like(y_slot)], -1)  # [x_i, 0]
        y_tokens = jnp.concatenate([jnp.zeros_like(x), y_slot], -1)  # [0, y_i]
        inputs = jnp.stack([x_tokens, y_tokens], 2).reshape(B, 2 * (n + 1), -1)[:, :-1]
        scored = 2 * jnp.arange(n + 1, dtype=jnp.int32) if self.score == "every" else jnp.array([2 * n], jnp.int32)
        return inputs, jnp.broadcast_to(scored, (B, scored.shape[0]))

    def loss(self, predictions: jax.Array, batch: Batch) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Half the mask-weighted mean squared error of the predictions [B, Q]."""
        weight = batch.mask.astype(jnp.float32)
        squared = jnp.square(predictions.astype(jnp.float32) - batch.targets)
        loss = 0.5 * (squared * weight).sum() / jnp.maximum(weight.sum(), 1.0)
        return loss, {"loss": loss}
