"""Weight-only probes: the copying score and Bietti et al.'s memory recall (anchors/induction.md 1.5, 3).

Row-vector convention, as the model computes (x @ kernel): a head reads the
residual x through W_Q, W_K, W_V [D, d] and writes through W_O [d, D]; E [V, D]
embeds, U [D, V] unembeds. The circuits are exact for attention-only models
without norms (`model.norm=none`, `mlp=none`); with norms or MLPs they only
approximate the paths they name. Token 0 (BOS) never appears in R, so every
probe here ranges over tokens 1..V-1 only.
"""

from __future__ import annotations

import numpy as np


def head_weights(model) -> dict[str, np.ndarray | None]:
    """Per-head matrices of a softmax-attention LM as numpy arrays.

    Returns E [V, D], U [D, V], P [T, D] or None (the learned position table,
    residual or shortformer), and W_Q, W_K, W_V [depth, H, D, d], W_O [depth, H, d, D], from each layer's
    `circuit_weights` (softmax attention's own maps; MLA's through its latent, tmem/mixers/mla.py).
    With grouped keys and values (mixer.kv_heads = G < H) query head h reads
    key-value head h // (H / G), so its W_K and W_V are that head's: every
    per-head circuit is then the one the head computes.
    """
    E = np.asarray(model.embed.embedding[...], np.float64)
    U = E.T if model.unembed is None else np.asarray(model.unembed.kernel[...], np.float64)
    P = None if model.pos_embed is None else np.asarray(model.pos_embed[...], np.float64)
    Q, K, V, O = [], [], [], []
    for block in model.blocks:
        mixer = block.mixer
        kernel, G = mixer.circuit_weights()
        H, d = mixer.heads, mixer.d_head
        D, E_kv = H * d, G * d
        qkv = np.asarray(kernel, np.float64)
        W_q, W_k, W_v = qkv[:, :D], qkv[:, D:D + E_kv], qkv[:, D + E_kv:]

        def split(m, heads):  # [D, heads*d] -> [H, D, d], each group's head repeated for its H / heads queries
            return np.repeat(m.reshape(D, heads, d).transpose(1, 0, 2), H // heads, axis=0)

        Q.append(split(W_q, H))
        K.append(split(W_k, G))
        V.append(split(W_v, G))
        O.append(np.asarray(mixer.out.kernel[...], np.float64).reshape(H, d, D))
    return {"E": E, "U": U, "P": P, "W_Q": np.stack(Q), "W_K": np.stack(K), "W_V": np.stack(V),
            "W_O": np.stack(O)}


def _top1(M: np.ndarray) -> float:
    """Fraction of rows whose largest entry is on the diagonal (recall of the identity map)."""
    return float(np.mean(np.argmax(M, axis=-1) == np.arange(M.shape[0])))


def copying(w: dict) -> dict[str, np.ndarray]:
    """Per head [depth, H]: eigenvalue positivity and top-1 copy accuracy of the full OV circuit.

    The full OV circuit E W_V W_O U [V, V] maps the attended token to the logits the
    head adds. Positivity sum(lambda) / sum(|lambda|) is +1 for a pure copier and -1
    for an anti-copier (Elhage et al. 2021); it is taken over the small d x d product
    W_O U E W_V, which has the same nonzero eigenvalues. Top-1 accuracy is the
    fraction of tokens whose own logit is the largest (ARENA's top_1_acc).
    """
    E, U = w["E"][1:], w["U"][:, 1:]
    depth, H = w["W_V"].shape[:2]
    positivity, top1 = np.zeros((depth, H)), np.zeros((depth, H))
    for layer in range(depth):
        for h in range(H):
            WV, WO = w["W_V"][layer, h], w["W_O"][layer, h]
            lam = np.linalg.eigvals(WO @ U @ E @ WV)
            total = np.abs(lam).sum()
            positivity[layer, h] = 0.0 if total == 0 else float(lam.sum().real / total)
            top1[layer, h] = _top1(E @ WV @ WO @ U)
    return {"positivity": positivity, "top1": top1}


def memory_recall(w: dict) -> dict[str, np.ndarray]:
    """Bietti et al.'s three recall probes per head [depth, H] (NaN where undefined).

    wo1: the head's output memory maps token k to its own unembedding
         (argmax_j [E W_V W_O U]_kj = k); the top-1 copy accuracy.
    wk1: (layers >= 1) the head's key memory matches a query of token k with the
         previous-token write of token k by the layer below (its heads' OV summed,
         each taken as fully attending the previous token):
         argmax_j (E_k W_Q) . (E_j OV_below W_K) = k.
    wk0: the head's positional key memory sends position t + 1 to t:
         argmax_s (P_{t+1} W_Q) . (P_s W_K) = t, over the keys the query can see
         (s <= t + 1; Bietti takes all s, but with trained positions nothing
         shapes the scores of pairs no query ever sees). Needs a learned table.
    """
    E = w["E"][1:]
    depth, H = w["W_V"].shape[:2]
    wo1, wk1, wk0 = (np.full((depth, H), np.nan) for _ in range(3))
    wo1[:] = copying(w)["top1"]
    P = w["P"]
    for layer in range(depth):
        if layer >= 1:
            ov_below = np.einsum("hDd,hde->De", w["W_V"][layer - 1], w["W_O"][layer - 1])
            for h in range(H):
                queries = E @ w["W_Q"][layer, h]
                keys = E @ ov_below @ w["W_K"][layer, h]
                wk1[layer, h] = _top1(queries @ keys.T)
        if P is not None:
            T = P.shape[0]
            visible = np.tril(np.ones((T, T), bool))[1:]  # rows: queries t + 1 = 1..T-1
            for h in range(H):
                scores = (P[1:] @ w["W_Q"][layer, h]) @ (P @ w["W_K"][layer, h]).T
                scores = np.where(visible, scores, -np.inf)
                wk0[layer, h] = float(np.mean(np.argmax(scores, axis=-1) == np.arange(T - 1)))
    return {"wo1": wo1, "wk1": wk1, "wk0": wk0}
