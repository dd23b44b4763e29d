"""Roles of Q, K and V (the note, Chapter 7): how alike a trained softmax layer's three maps are.

A head reads the residual x through W_Q, W_K, W_V [D, d]. Keys address and values are returned: where a task
needs the value of a token to be what addresses it (a Hopfield pattern, which is both), W_V can be W_K; where
queries match keys by identity, W_Q can be W_K. Per layer and head the probe reports, for (W_K, W_V) and
(W_Q, W_K):

* `overlap`: the mean squared cosine of the principal angles between the two maps' column spaces,
  ||U_A^T U_B||_F^2 / d (U orthonormal bases): 1 when they read the same d directions of the residual, 0 when
  orthogonal ones, and d / D on average for two random d-dimensional subspaces (`random_overlap`);
* `cosine`: <A, B>_F / (||A||_F ||B||_F), 1 only for the same map up to scale (a tied pair), near 0 for
  independent random maps: the same directions read into differently arranged coordinates score a high
  overlap and a low cosine.

It reads any layer with `qkv_maps` (softmax's fused kernel split as the layer reads it, ties applied), on
any task.
"""

from __future__ import annotations

import numpy as np

from tmem.mixers import layer_of
from tmem.probes.base import Probe, ProbeInput, mixers_without

PAIRS = {"kv": ("W_K", "W_V"), "qk": ("W_Q", "W_K")}


def subspace_overlap(A, B) -> float:
    """||U_A^T U_B||_F^2 / min(rank A, rank B) for maps A, B [D, d]: the mean squared cosine of the principal
    angles between their column spaces."""
    bases = []
    for M in (A, B):
        U, s, _ = np.linalg.svd(np.asarray(M, np.float64), full_matrices=False)
        bases.append(U[:, s > s[0] * 1e-9])
    return float(np.sum(np.square(bases[0].T @ bases[1])) / min(b.shape[1] for b in bases))


def map_cosine(A, B) -> float:
    A, B = np.asarray(A, np.float64), np.asarray(B, np.float64)
    return float(np.sum(A * B) / np.sqrt(np.sum(A * A) * np.sum(B * B)))


def random_overlap(width: int, d: int) -> float:
    """E[||U_A^T U_B||_F^2] / d = d / D for independent uniformly random d-dimensional subspaces of R^D."""
    return d / width


def head_maps(mixer) -> dict[str, np.ndarray]:
    """W_Q, W_K, W_V [H, D, d] of a layer with `qkv_maps` (each query head's key-value head where grouped)."""
    H, G, d = mixer.heads, mixer.kv_heads, mixer.d_head
    maps = {}
    for name, W, heads in zip(("W_Q", "W_K", "W_V"), mixer.qkv_maps(mixer.qkv.kernel[...]), (H, G, G)):
        W = np.asarray(W, np.float64)
        maps[name] = np.repeat(W.reshape(W.shape[0], heads, d).transpose(1, 0, 2), H // heads, axis=0)
    return maps


def roles(model) -> dict:
    layers = {}
    for i, block in enumerate(model.blocks):
        maps = head_maps(block.mixer)
        H, D, d = maps["W_Q"].shape
        report = {"random_overlap": random_overlap(D, d)}
        for pair, (a, b) in PAIRS.items():
            report[f"{pair}_overlap"] = [subspace_overlap(maps[a][h], maps[b][h]) for h in range(H)]
            report[f"{pair}_cosine"] = [map_cosine(maps[a][h], maps[b][h]) for h in range(H)]
            for measure in ("overlap", "cosine"):
                report[f"mean_{pair}_{measure}"] = float(np.mean(report[f"{pair}_{measure}"]))
        layers[str(i)] = report
    means = {f"mean_{pair}_{m}": float(np.mean([r[f"mean_{pair}_{m}"] for r in layers.values()]))
             for pair in PAIRS for m in ("overlap", "cosine")}
    return {"layers": layers, **means}


def run(inp: ProbeInput):
    return roles(inp.model), {}


def _applies(cfg):
    if others := mixers_without(cfg, lambda m: hasattr(layer_of(m), "qkv_maps")):
        return f"reads layers with a fused q, k, v kernel (softmax), not {others}"
    return None


probe = Probe(run=run, applies=_applies,
              description="per softmax head, how alike W_K and W_V (and W_Q and W_K) are: subspace overlap, cosine")
