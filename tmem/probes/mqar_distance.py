"""Held-out recall against the distance from query back to key (MQAR).

Zoology's power-law query placement makes most queries near their keys; this
probe shows whether recall holds up for the far ones, where a model with a
short effective memory fails first. `query_attention_figure` shows where one
sequence's queries read (notebooks/mqar_memory.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from tasks import heldout
from tmem.probes.base import Probe, ProbeInput


def compiled(model):
    """The model's forward at given positions, compiled once for every batch of one shape."""
    return jax.jit(lambda x, p: model(x, positions=p))


def recall_by_distance(model, batch, chunk: int = 500, forward=None) -> dict[str, list]:
    """Accuracy and loss per power-of-two distance bin [2^k, 2^(k+1)); `forward`: `compiled(model)`, to reuse."""
    correct, loss = [], []
    forward = forward or compiled(model)
    for i in range(0, batch.inputs.shape[0], chunk):
        logits = forward(batch.inputs[i:i + chunk], batch.positions[i:i + chunk])
        targets = batch.targets[i:i + chunk]
        correct.append(np.asarray(jnp.argmax(logits, -1) == targets))
        loss.append(np.asarray(optax.softmax_cross_entropy_with_integer_labels(logits, targets)))
    correct, loss = np.concatenate(correct).ravel(), np.concatenate(loss).ravel()
    distance = np.asarray(batch.meta["distance"]).ravel()
    bins = np.floor(np.log2(distance)).astype(int)
    rows = {"distance_low": [], "distance_high": [], "count": [], "accuracy": [], "loss": []}
    for b in np.unique(bins):
        sel = bins == b
        rows["distance_low"].append(int(2**b))
        rows["distance_high"].append(int(2 ** (b + 1) - 1))
        rows["count"].append(int(sel.sum()))
        rows["accuracy"].append(float(correct[sel].mean()))
        rows["loss"].append(float(loss[sel].mean()))
    rows["overall_accuracy"] = float(correct.mean())
    return rows


def distance_figure(rows):
    """Accuracy per distance bin (`recall_by_distance`'s rows), each point labelled with its query count."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 3.2))
    ax = fig.subplots()
    centers = [np.sqrt(lo * (hi + 1)) for lo, hi in zip(rows["distance_low"], rows["distance_high"])]
    ax.plot(centers, rows["accuracy"], "o-")
    for x, y, n in zip(centers, rows["accuracy"], rows["count"]):
        ax.annotate(str(n), (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    ax.set(xscale="log", xlabel="distance from query back to key (tokens)", ylabel="held-out accuracy",
           ylim=(0, 1.05), title="MQAR recall by distance (labels: queries per bin)")
    fig.tight_layout()
    return fig


def query_attention_figure(A, positions, distance):
    """One MQAR sequence's attention from each query over the whole sequence, per layer and head.

    A: [depth, H, T, S] attention weights of the sequence (`heads.forward_with_attention`, one example);
    positions, distance: its queries' positions and distances back to their keys (the batch's `positions`
    and `meta["distance"]`). Rows are the queries in order of position; o marks each query's key and x the
    value after it, the two places a recall can read from.
    """
    from matplotlib.figure import Figure

    A = np.asarray(A)
    depth, heads = A.shape[:2]
    order = np.argsort(np.asarray(positions))
    query = np.asarray(positions)[order]
    key = query - np.asarray(distance)[order]
    rows = np.arange(len(query))
    fig = Figure(figsize=(3.0 * heads + 0.6, (1.0 + 0.25 * len(query)) * depth + 0.5), layout="constrained")
    axes = fig.subplots(depth, heads, squeeze=False)
    for layer in range(depth):
        for h in range(heads):
            ax = axes[layer, h]
            ax.imshow(A[layer, h][query], cmap="viridis", vmin=0, vmax=1, aspect="auto", interpolation="nearest")
            ax.scatter(key, rows, marker="o", s=20, facecolors="none", edgecolors="red", label="its key")
            ax.scatter(key + 1, rows, marker="x", s=14, color="red", label="its value")
            ax.set_yticks(rows, query, fontsize=6)
            ax.tick_params(labelsize=6)
            ax.set_title(f"L{layer}H{h}", fontsize=8)
    axes[-1, 0].set_xlabel("key position", fontsize=8)
    axes[0, 0].set_ylabel("query position", fontsize=8)
    axes[0, -1].legend(fontsize=6, loc="upper right")
    fig.suptitle("attention from each query of one held-out sequence", fontsize=9)
    return fig


def run(inp: ProbeInput):
    rows = recall_by_distance(inp.model, heldout(inp.cfg.task))
    return rows, {"mqar_distance": distance_figure(rows)}


probe = Probe(
    run=run,
    applies=lambda cfg: None if cfg.task.name == "mqar" else f"needs an MQAR run, not {cfg.task.name!r}",
    description="held-out accuracy and loss per query-to-key distance bin",
)
