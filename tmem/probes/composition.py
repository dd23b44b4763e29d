"""K-, Q- and V-composition between the heads of two layers (Elhage et al. 2021; Chapter 11).

A head of a later layer composes with a head of an earlier one when it reads
what that head wrote: through its keys (K-composition, the induction head
reading the previous-token head's write), its queries (Q) or its values (V).
The score is ||W_A W_B||_F / (||W_A||_F ||W_B||_F): 1 when a rank-one writer
writes exactly the direction a rank-one reader reads, 0 when the write lies
in what the reader ignores. A perfect composition of two rank-r maps (say, r
tokens each written to its own direction and read back from it) scores
1 / sqrt(r), and unrelated random circuits in a width-D residual about
1 / sqrt(D), so read a trained model's scores against its own early
checkpoints and its other pairs.

Row-vector convention, as circuits.py (x @ kernel): head h's OV circuit is
W_V W_O [D, D] (x -> x W_V W_O) and its QK circuit W_Q W_K^T [D, D]
(score x_q W_Q W_K^T x_k^T). If the key residual holds x OV_a, the reader
scores x_q QK_b OV_a^T x^T, so K-composition is ||QK_b OV_a^T||; the query
side gives ||OV_a QK_b|| (Q) and the value side ||OV_a OV_b|| (V). Transposes
leave the Frobenius norm alone, so these are Elhage's ||W_QK W_OV||,
||W_QK^T W_OV|| and ||W_OV^b W_OV^a|| in the column convention.
"""

from __future__ import annotations

import numpy as np


def per_query_head(W: np.ndarray, heads: int) -> np.ndarray:
    """[G, D, d] key or value weights of G kv heads -> [heads, D, d], query head h reading kv head h // (heads / G)."""
    return np.repeat(W, heads // W.shape[0], axis=0)


def ov_circuits(W_V: np.ndarray, W_O: np.ndarray) -> np.ndarray:
    """[H, D, D]: each head's W_V W_O (W_V may hold fewer, grouped kv heads)."""
    return np.einsum("hDd,hdE->hDE", per_query_head(W_V, W_O.shape[0]), W_O)


def qk_circuits(W_Q: np.ndarray, W_K: np.ndarray) -> np.ndarray:
    """[H, D, D]: each head's W_Q W_K^T (W_K may hold fewer, grouped kv heads)."""
    return np.einsum("hDd,hEd->hDE", W_Q, per_query_head(W_K, W_Q.shape[0]))


def composition_score(A: np.ndarray, B: np.ndarray) -> float:
    """||A B||_F / (||A||_F ||B||_F), in [0, 1]; 0 when either matrix is zero."""
    norm = np.linalg.norm(A) * np.linalg.norm(B)
    return 0.0 if norm == 0 else float(np.linalg.norm(A @ B) / norm)


def composition_scores(w: dict, writer: int = 0, reader: int = 1) -> dict[str, np.ndarray]:
    """{"K", "Q", "V"}: [H_writer, H_reader] scores of every writer-layer head against every reader-layer head.

    w: circuits.head_weights' dict (W_Q, W_K, W_V [depth, H or G, D, d], W_O [depth, H, d, D]).
    """
    ov_a = ov_circuits(w["W_V"][writer], w["W_O"][writer])
    ov_b = ov_circuits(w["W_V"][reader], w["W_O"][reader])
    qk_b = qk_circuits(w["W_Q"][reader], w["W_K"][reader])
    pairs = {"K": lambda a, b: (qk_b[b], ov_a[a].T), "Q": lambda a, b: (ov_a[a], qk_b[b]),
             "V": lambda a, b: (ov_a[a], ov_b[b])}
    return {name: np.array([[composition_score(*pair(a, b)) for b in range(len(qk_b))] for a in range(len(ov_a))])
            for name, pair in pairs.items()}


def pair_series(k_composition: list, writers: list[list[int]], readers: list[list[int]]) -> dict:
    """The K-composition of the named (layer-0 writer, layer-1 reader) pairs at each checkpoint, and of the rest.

    k_composition: one [H0, H1] matrix per checkpoint. Returns `pairs` (mean over the
    named pairs) and `others` (mean over every other pair, the control), or None where
    no pair is named.
    """
    a = sorted({h for layer, h in writers if layer == 0})
    b = sorted({h for layer, h in readers if layer == 1})
    pairs, others = [], []
    for m in np.asarray(k_composition, float):
        named = np.zeros(m.shape, bool)
        named[np.ix_(a, b)] = True
        pairs.append(float(m[named].mean()) if named.any() else None)
        others.append(float(m[~named].mean()) if (~named).any() else None)
    return {"writers": [[0, h] for h in a], "readers": [[1, h] for h in b], "pairs": pairs, "others": others}


def composition_figure(steps: list[int], series: dict, formation_step: int | None):
    """K-composition of the previous-token heads into the induction heads over training, against the other pairs."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.6))
    ax = fig.subplots()
    nan = lambda xs: [np.nan if x is None else x for x in xs]  # noqa: E731
    names = lambda hs: ", ".join(f"L{layer}H{h}" for layer, h in hs) or "none"  # noqa: E731
    ax.plot(steps, nan(series["pairs"]), "o-", ms=3, color="C0",
            label=f"previous-token ({names(series['writers'])}) -> induction ({names(series['readers'])})")
    ax.plot(steps, nan(series["others"]), "-", color="0.5", label="every other layer-0 -> layer-1 pair")
    if formation_step is not None:
        ax.axvline(formation_step, color="C0", lw=1, ls="--")
        ax.annotate(f"formed at {formation_step}", (formation_step, ax.get_ylim()[1]), color="C0", fontsize=8,
                    ha="center", va="bottom")
    ax.set(xlabel="training step", ylabel="K-composition score")
    ax.legend(fontsize=7)
    ax.set_title("K-composition over training", fontsize=9, pad=14)
    fig.tight_layout()
    return fig
