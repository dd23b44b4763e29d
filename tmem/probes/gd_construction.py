"""Proposition 1 in a model: load the GD construction, and measure how close learned weights are to it.

Only the products of the projections are identifiable (W_Q, W_K up to an
invertible map, and a scale s on W_Q W_K^T against 1/s on W_V P). In Flax's
row convention a head reads e_j^T A e_i with A = K_q K_k^T and writes e_i^T B
with B = K_v K_P. The y-slot of the query after one layer is

    sum_i sum_h (x_q^T A_h[:d] e_i)(e_i^T B_h[:, y]) = sum_abc x_q[a] T[a, b, c] C[b, c],

with C = sum_i e_i e_i^T and T[a, b, c] = sum_h A_h[a, b] B_h[c, y]. Because C is
symmetric, T symmetrised over (b, c) is exactly what a one-layer model's
prediction depends on: the products summed over heads. The alignment is the
cosine between that tensor and the construction's, and the best scale is the
step size the model implies.
"""

from __future__ import annotations

import numpy as np

from tmem.memory.lsa import gd_construction
from tmem.mixers.lsa import construction_weights
from tmem.model import load_weights
from tmem.probes.base import mixers_without


def construction_applies(cfg) -> str | None:
    """None when the model can hold the construction, else why not."""
    m = cfg.model
    if others := mixers_without(cfg, lambda m: m.name == "lsa"):
        return f"mixer {others!r} is not linear self-attention"
    if m.read_in != "identity" or m.norm != "none" or cfg.mlp.name != "none":
        return "needs model.read_in=identity, model.norm=none and mlp=none (the paper's LSA-only model)"
    if cfg.mixer.layout != "prompt" or cfg.task.format != "vonoswald":
        return "needs the von Oswald prompt read with mixer.layout=prompt"
    if m.positions != "none":
        return "needs model.positions=none"
    if (cfg.mixer.head_dim or m.width) < m.width:
        return "needs mixer.head_dim >= model.width"
    return None


def load_construction(model, cfg, etas, gammas=None) -> None:
    """Set every block to Proposition 1 (GD, or GD++ with gammas): block l takes step etas[l].

    A tied model has one block, so all its steps share etas[0] and gammas[0].
    """
    if why := construction_applies(cfg):
        raise ValueError(f"cannot load the GD construction: {why}")
    n, d = cfg.task.num_examples, cfg.task.dim
    gammas = [0.0] * len(etas) if gammas is None else gammas
    blocks = 1 if cfg.model.tie_blocks else cfg.model.depth
    if len(etas) != cfg.model.depth or len(gammas) != cfg.model.depth:
        raise ValueError(f"need one eta and gamma per layer ({cfg.model.depth}), got {len(etas)} and {len(gammas)}")
    if blocks == 1 and (len(set(map(float, etas))) > 1 or len(set(map(float, gammas))) > 1):
        raise ValueError("a tied model takes one eta and one gamma for all its steps")
    weights = {i: {"mixer": construction_weights(cfg.mixer, cfg.model.width, d, float(etas[i]) / n, float(gammas[i]))}
               for i in range(blocks)}
    load_weights(model, {"blocks": weights})


def head_products(mixer) -> tuple[np.ndarray, np.ndarray]:
    """Per-head A_h = K_q K_k^T and B_h = K_v K_P of an LSA mixer: [H, D, D] each."""
    H, dk = mixer.heads, mixer.d_head
    D = mixer.query.kernel[...].shape[0]
    q, k, v = (np.asarray(m.kernel[...], np.float64).reshape(D, H, dk) for m in (mixer.query, mixer.key, mixer.value))
    p = np.asarray(mixer.out.kernel[...], np.float64).reshape(H, dk, D)
    return np.einsum("ahk,bhk->hab", q, k), np.einsum("chk,hkz->hcz", v, p)


def _prediction_tensor(A, B, d: int) -> np.ndarray:
    T = np.einsum("hab,hc->abc", A[:, :d, :], B[:, :, -1])
    return 0.5 * (T + T.transpose(0, 2, 1))


def _cosine(a, b) -> float:
    return float(np.sum(a * b) / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))


def construction_alignment(model, cfg) -> dict:
    """Cosines of a one-layer LSA's products with Proposition 1, and the step size they imply."""
    d, n = cfg.task.dim, cfg.task.num_examples
    m = gd_construction(d, 1, 1.0 / n)  # eta = 1: the best scale is then the implied eta
    A_gd, B_gd = (m["W_Q"].T @ m["W_K"])[None], (m["W_V"].T @ m["P"].T)[None]
    A, B = head_products(model.blocks[0].mixer)
    T, T_gd = _prediction_tensor(A, B, d), _prediction_tensor(A_gd, B_gd, d)
    return {
        "construction_cosine": _cosine(T, T_gd),
        "construction_eta": float(np.sum(T * T_gd) / np.sum(T_gd * T_gd)),
        # von Oswald's per-matrix view (their Fig. 9), per head; the sign of s <-> 1/s is free
        "head_qk_cosine": [abs(_cosine(a, A_gd[0])) for a in A],
        "head_pv_cosine": [abs(_cosine(b, B_gd[0])) for b in B],
    }
