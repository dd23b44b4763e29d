"""The note's conjecture on a trained memorize model: a fact it knows fails when the query is rephrased.

    python eval.py run=<memorize run> 'probes=[rephrasing]'
    python eval.py run=<memorize run> 'probes=[rephrasing]' '+options.rephrasing.radii=[0,0.5,1]'

A rephrased query is modelled as the key's code moved off its embedding row:
noise of norm r |e_k| in a uniformly random direction added to the code e_k
before the block (so the MLP, and the residual stream the unembedding reads,
see the moved code). For each stored fact (recalled from its clean code) and
each relative radius r, `draws` directions are tried; the fact is recalled
when the argmax over the values is still its own. The note (Chapter 5 on
biases) reads the failure as the query leaving the stored key's response
region, whose width the score function and a (negative) bias set.

Reported: `recall` (a dict radius -> the share of stored facts' draws
still recalled), `r50` (the radius where that share falls to one half,
linear between grid points), `width` (per fact, the largest grid radius up
to which at least half its draws are recalled; median and 10th/90th
percentiles over the stored facts), and for scale `nearest_key` (median over
facts of the nearest other key code's distance, relative to |e_k|: random
codes at width d sit near sqrt 2 apart) and `nearest_code`, the same draws
read by the nearest key code (recall and r50): the widest regions these
codes allow, each fact owning its whole Voronoi cell. With biases,
`bias_in` is the mean of the first block's W_in bias (negative: keys fire
only on queries closer than a threshold).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tmem.probes.base import Probe, ProbeInput, memorize_alone

# fine where the trained models' regions end (a third of the code's norm), coarse out to beyond the nearest key
DEFAULTS = {"radii": [0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.8, 1.0, 1.5, 2.0], "draws": 16}


def moved_codes(codes, radii, draws: int, key: jax.Array):
    """codes [N, d] moved by r |code| in `draws` random directions each: [R, N, draws, d]."""
    n = jax.random.normal(key, (codes.shape[0], draws, codes.shape[1]))
    n = n / jnp.linalg.norm(n, axis=-1, keepdims=True)
    scale = jnp.asarray(radii, jnp.float32)[:, None, None, None] * jnp.linalg.norm(codes, axis=-1)[None, :, None, None]
    return codes[None, :, None, :] + scale * n[None]


def recall_under_noise(predict, codes, values, radii, draws: int, key: jax.Array) -> np.ndarray:
    """[R, N]: for each radius and fact, the share of its moved codes for which `predict` ([M, d] codes -> [M]
    values) still gives the fact's value."""
    x = moved_codes(codes, radii, draws, key)
    R, N = x.shape[:2]
    got = np.asarray(predict(x.reshape(-1, x.shape[-1]))).reshape(R, N, draws)
    return (got == np.asarray(values)[None, :, None]).mean(-1)


def widths(per_fact: np.ndarray, radii) -> np.ndarray:
    """Per fact, the largest grid radius up to which (every radius from 0) at least half its draws are
    recalled; 0 when even the first radius fails."""
    held = np.cumprod(per_fact >= 0.5, axis=0).astype(bool)  # [R, N]: held at this radius and every smaller one
    radii = np.asarray(radii, float)
    return np.where(held.any(0), radii[np.maximum(held.sum(0) - 1, 0)], 0.0)


def crossing(curve: np.ndarray, radii, level: float = 0.5) -> float | None:
    """The radius where a falling curve first reaches `level`, linear between grid points; None if it never does."""
    radii = np.asarray(radii, float)
    below = np.flatnonzero(curve <= level)
    if not len(below):
        return None
    i = below[0]
    if i == 0:
        return float(radii[0])
    t = (curve[i - 1] - level) / (curve[i - 1] - curve[i])
    return float(radii[i - 1] + t * (radii[i] - radii[i - 1]))


def nearest_code(codes, values):
    """The widest regions these codes allow: [M, d] -> the value of the nearest code (each fact owns its whole
    Voronoi cell, shared with its neighbours of the same value)."""
    values = jnp.asarray(values)

    @jax.jit
    def predict(x_md):
        d2 = jnp.sum(x_md**2, -1)[:, None] - 2 * x_md @ codes.T + jnp.sum(codes**2, -1)[None]
        return values[jnp.argmin(d2, -1)]

    return predict


def run(inp: ProbeInput):
    o = {**DEFAULTS, **inp.options}
    radii = [float(r) for r in o["radii"]]
    task, model = inp.cfg.task, inp.model
    F = task.num_facts
    facts = np.arange(F)
    values = np.asarray(task.values())
    codes = model.embed.embedding[...][:F]

    @jax.jit
    def predict(x_md):
        return jnp.argmax(model.forward_codes(x_md[:, None, :])[0][:, 0, F:], -1)

    stored = np.asarray(predict(codes)) == values
    if not stored.any():
        return {"facts": int(F), "stored": 0, "why": "no fact is stored: nothing to rephrase"}, {}
    key = inp.key if inp.key is not None else jax.random.key(0)
    draws = int(o["draws"])
    per_fact = recall_under_noise(predict, codes[stored], values[stored], radii, draws, key)
    # the same draws read by the nearest code: how far the regions could reach with these codes
    reference = recall_under_noise(nearest_code(codes, values), codes[stored], values[stored], radii, draws, key)
    curve, ref_curve = per_fact.mean(1), reference.mean(1)
    w = widths(per_fact, radii)
    c = np.asarray(codes)
    dist = np.linalg.norm(c[:, None] - c[None], axis=-1) / np.linalg.norm(c, axis=-1)[:, None]
    dist[facts, facts] = np.inf
    metrics = {
        "facts": int(F), "stored": int(stored.sum()), "draws": draws,
        "recall": {f"{r:g}": float(v) for r, v in zip(radii, curve)},
        "r50": crossing(curve, radii),
        "width": {"median": float(np.median(w)), "p10": float(np.percentile(w, 10)),
                  "p90": float(np.percentile(w, 90))},
        "nearest_key": float(np.median(dist.min(1))),
        "nearest_code": {"recall": {f"{r:g}": float(v) for r, v in zip(radii, ref_curve)},
                         "r50": crossing(ref_curve, radii)},
    }
    mlp = model.blocks[0].mlp
    if getattr(getattr(mlp, "w_in", None), "bias", None) is not None:
        metrics["bias_in"] = float(jnp.mean(mlp.w_in.bias[...]))
    return metrics, {"rephrasing": _figure(radii, curve, ref_curve, metrics)}


def _figure(radii, curve, ref_curve, metrics):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.6, 3.2))
    ax = fig.subplots()
    ax.plot(radii, curve, "o-", ms=3, label="the model")
    ax.plot(radii, ref_curve, "s--", ms=3, label="nearest code")
    ax.axvline(metrics["nearest_key"], color="gray", ls=":", label="nearest other key")
    ax.set(xlabel="noise norm / key code norm", ylabel="stored facts recalled", ylim=(-0.02, 1.02),
           title=f"{metrics['stored']} stored facts, {metrics['draws']} directions each")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


probe = Probe(run=run, applies=memorize_alone,
              description="recall of stored facts against noise on the key's code: each fact's response region")
