"""AdamW with warmup, a decay schedule and gradient clipping (configs/optim/)."""

from __future__ import annotations

import jax
import optax

from tmem.schema import OptimConfig


def learning_rate(cfg: OptimConfig, decay_end: int) -> optax.Schedule:
    """Linear warmup from 0, then cosine / linear decay to final_lr_ratio * lr at step decay_end, or constant."""
    after = max(decay_end - cfg.warmup_steps, 1)
    if cfg.schedule == "cosine":
        decay = optax.cosine_decay_schedule(cfg.lr, after, alpha=cfg.final_lr_ratio)
    elif cfg.schedule == "linear":
        decay = optax.linear_schedule(cfg.lr, cfg.lr * cfg.final_lr_ratio, after)
    else:
        decay = optax.constant_schedule(cfg.lr)
    if cfg.warmup_steps == 0:
        return decay
    warmup = optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps)
    return optax.join_schedules([warmup, decay], [cfg.warmup_steps])


def build_optimizer(cfg: OptimConfig, decay_end: int) -> optax.GradientTransformation:
    # Weight decay on matrices only: decaying norm scales and biases only hurts.
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # noqa: E731
    adamw = optax.adamw(learning_rate(cfg, decay_end), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                        weight_decay=cfg.weight_decay or 0.0, mask=decay_mask)  # null: none
    if cfg.clip_norm is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), adamw)
