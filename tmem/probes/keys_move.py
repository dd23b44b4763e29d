"""Chapter 7 on a trained softmax model: does one gradient step move each key toward the queries it helps?

    python eval.py run=<run with softmax layers> 'probes=[keys_move]'        # every checkpoint of the run
    python eval.py run=<run> 'probes=[keys_move]' +options.keys_move.batch=64

For one query t and key i the note writes dL/dl_ti = a_ti (v_i - o_t)^T g_t
(g_t the loss's gradient at the head's read o_t): a negative value is a
positive advantage, raising the logit helps. If keys were free parameters
a step would move key i along its advantage-weighted queries

    u_i = -dL/dk_i = beta * sum_t (-dL/dl_ti) q_t,

toward the queries it helps and away from the ones it hurts. In a model a
key is W_K^T x_i, so the step acts on W_K (and on whatever made x_i) and is
shared by every token with similar features. The probe measures how much of
the note's picture survives that sharing: at each checkpoint, on one batch,
the key's change under one plain gradient step on every trained parameter,
dk_i = -J_k grad L (a Jacobian-vector product: an SGD step in the limit of a
small rate, so no rate is chosen), against u_i. Reported per layer (the mean
over its heads and over the keys some query moves, |u_i| > 0):

* `cos`: mean cos(dk_i, u_i); `cos_weighted`: weighted by |u_i|, so the keys
  the loss pulls hardest count most;
* `cos_helped`: the same against u+_i, only the queries with a positive
  advantage (-dL/dl_ti > 0), the note's "queries they help";
* `shuffled`, `shuffled_weighted`: the control, dk_i against the u_j of
  another key of the same head drawn by a random permutation: what the
  alignment is for a key's update and queries that have nothing to do with it.

The step is the gradient's (SGD), not the run's optimizer's: Adam rescales
each coordinate and would turn the direction.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tmem.probes.base import Probe, ProbeInput, mixers_without

DEFAULTS = {"batch": 32}
FIELDS = ("cos", "cos_weighted", "cos_helped", "shuffled", "shuffled_weighted")


def logit_gradients(a, v, g):
    """dL/dl [B, H, T, S] = a_ts (v_s - o_t) . g_t (the note, Chapter 7), with o_t = sum_s a_ts v_s.

    a [B, H, T, S] the weights, v [B, S, G, d] the values of G <= H kv heads (query head h reads kv head
    h // (H / G)), g [B, T, H, d] the loss's gradient at each head's read."""
    H, G = a.shape[1], v.shape[2]
    v = jnp.repeat(v, H // G, axis=2)
    o = jnp.einsum("bhts,bshd->bthd", a, v)
    vg = jnp.einsum("bshd,bthd->bhts", v, g)
    og = jnp.einsum("bthd,bthd->bht", o, g)
    return a * (vg - og[..., None])


def advantage_queries(dl, q, beta, kv_heads: int, helped_only: bool = False):
    """u [B, S, G, d] = beta sum_t (-dL/dl_ts) q_t over the query heads of each kv head; with helped_only, only
    the terms with a positive advantage (-dL/dl > 0). Without helped_only it is -dL/dk exactly."""
    B, H, T, S = dl.shape
    adv = -dl
    if helped_only:
        adv = jnp.maximum(adv, 0.0)
    adv = adv.reshape(B, kv_heads, H // kv_heads, T, S)
    q = q.reshape(B, T, kv_heads, H // kv_heads, -1)
    return beta * jnp.einsum("bgrts,btgrd->bsgd", adv, q)


def _cosines(x, y):
    """cos(x, y) along the last axis, and the norm of y."""
    ny = jnp.linalg.norm(y, axis=-1)
    return jnp.sum(x * y, -1) / jnp.maximum(jnp.linalg.norm(x, axis=-1) * ny, 1e-30), ny


def alignment(dk, u, u_helped, key: jax.Array) -> dict:
    """The report's fields for one layer from dk, u, u+ [B, S, G, d]: means over the heads of the per-head means
    over the keys that some query moves (|u| above 1e-6 of the head's largest)."""
    return {name: float(x) if name != "keys" else int(x) for name, x in _alignment(dk, u, u_helped, key).items()}


@jax.jit
def _alignment(dk, u, u_helped, key):
    B, S, G, d = dk.shape
    flat = lambda x: jnp.moveaxis(x, 2, 0).reshape(G, B * S, d)  # noqa: E731  [G, keys, d]
    dk, u, u_helped = flat(dk), flat(u), flat(u_helped)
    perm = jax.vmap(lambda k: jax.random.permutation(k, B * S))(jax.random.split(key, G))
    moved = jnp.linalg.norm(u, axis=-1)
    moved = moved > 1e-6 * moved.max(-1, keepdims=True)
    # the control's partner must be moved too, so a zero u_j does not pass for an unrelated direction
    u_other = jnp.take_along_axis(u, perm[..., None], axis=1)
    both = moved & jnp.take_along_axis(moved, perm, axis=1)
    c, n = _cosines(dk, u)
    ch, _ = _cosines(dk, u_helped)
    cs, ns = _cosines(dk, u_other)

    def mean(x, where, w=None):
        w = where.astype(x.dtype) if w is None else w * where
        return jnp.mean(jnp.sum(x * w, -1) / jnp.maximum(jnp.sum(w, -1), 1e-30))

    return {"cos": mean(c, moved), "cos_weighted": mean(c, moved, n), "cos_helped": mean(ch, moved),
            "shuffled": mean(cs, both), "shuffled_weighted": mean(cs, both, ns), "keys": moved.sum()}


def step_alignment(model, task, batch, key: jax.Array) -> dict:
    """{"layer<i>": alignment(...)} for every softmax layer of `model` on `batch` (one step's worth)."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    layers = [(b.mixer.kv_heads, b.mixer.cfg.beta(b.mixer.d_head)) for b in model.blocks]
    dks, us, helped = _step(graphdef, task, tuple(layers), params, rest, batch)
    return {f"layer{i}": alignment(dk, u, uh, jax.random.fold_in(key, i))
            for i, (dk, u, uh) in enumerate(zip(dks, us, helped))}


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _step(graphdef, task, layers, params, rest, batch):
    """Per layer: the keys' change dk under one gradient step on `params` (the loss's, on `batch`), and the
    advantage-weighted queries u and u+."""
    def sown(params, perturb=None):
        m = nnx.merge(graphdef, params, rest)
        return nnx.capture(m, nnx.Intermediate, init=perturb)(batch.inputs, positions=batch.positions)

    _, zeros = nnx.capture(nnx.merge(graphdef, params, rest), nnx.Perturbation)(batch.inputs,
                                                                              positions=batch.positions)

    def loss(params, perturb):
        logits, inter = sown(params, perturb)
        return task.loss(logits.astype(jnp.float32), batch)[0], inter

    (grads, g_read), inter = jax.grad(loss, argnums=(0, 1), has_aux=True)(params, zeros)
    blocks = list(inter["blocks"].values())

    def keys_of(p):
        return [b["mixer"]["keys"][0] for b in sown(p)[1]["blocks"].values()]

    # dk = -J grad L, a Jacobian-vector product taken as the transpose of the vector-Jacobian product (the
    # layers' matmuls have a custom VJP, which forward-mode autodiff cannot enter); it is linear, so exact
    keys, pullback = jax.vjp(keys_of, params)
    _, transpose = jax.vjp(lambda w: pullback(w)[0], [jnp.zeros_like(k) for k in keys])
    (dks,) = transpose(jax.tree.map(jnp.negative, grads))
    us, helped = [], []
    for i, (block, (kv_heads, beta)) in enumerate(zip(blocks, layers)):
        mixer = block["mixer"]
        dl = logit_gradients(mixer["attention"][0], mixer["values"][0], g_read["blocks"][i]["mixer"]["read"])
        us.append(advantage_queries(dl, mixer["queries"][0], beta, kv_heads))
        helped.append(advantage_queries(dl, mixer["queries"][0], beta, kv_heads, helped_only=True))
    return dks, us, helped


def run(inp: ProbeInput):
    o = {**DEFAULTS, **inp.options}
    task = inp.cfg.task
    key = inp.key if inp.key is not None else jax.random.key(0)
    batch = task.sample(key, int(o["batch"]))
    models = inp.history.models() if inp.history is not None else [(inp.step, inp.model)]
    steps = {str(step): step_alignment(model, task, batch, key) for step, model in models}
    last = steps[max(steps, key=int)]
    metrics = {"batch": int(o["batch"]), "steps": steps, "final": last,
               "mean_over_steps": {layer: {f: float(np.mean([s[layer][f] for s in steps.values()]))
                                           for f in FIELDS} for layer in last}}
    return metrics, {"keys_move": _figure(steps)}


def _figure(steps: dict):
    from matplotlib.figure import Figure

    xs = sorted(steps, key=int)
    layers = list(steps[xs[0]])
    fig = Figure(figsize=(3.4 * len(layers) + 0.4, 3.0))
    for ax, layer in zip(fig.subplots(1, len(layers), squeeze=False)[0], layers):
        for field, style in (("cos", "o-"), ("cos_helped", "s-"), ("shuffled", "x:")):
            ax.plot([int(x) for x in xs], [steps[x][layer][field] for x in xs], style, ms=3, label=field)
        ax.axhline(0, color="gray", lw=0.5)
        ax.set(xlabel="training step", title=layer)
        ax.legend(fontsize=7)
    fig.axes[0].set_ylabel("cos(key's step, its queries)")
    fig.tight_layout()
    return fig


def applies(cfg) -> str | None:
    if others := mixers_without(cfg, lambda m: m.name == "softmax"):
        return f"reads softmax attention in every layer, not {others!r}"
    if cfg.model.tie_blocks:
        return "reads each layer once; model.tie_blocks applies one block several times"
    if any(m.length_scale != "none" for m in cfg.layers):
        return "reads logits beta q . k with no length scale: mixer.length_scale=none"
    if getattr(cfg.task, "input_kind", "tokens") != "tokens":
        return "reads a token model"
    return None


probe = Probe(run=run, applies=applies,
              description="per optimizer step: each softmax key's gradient step against its advantage-weighted "
                          "queries, and a shuffled control")
