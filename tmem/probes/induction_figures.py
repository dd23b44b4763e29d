"""Figures of the induction probe: attention patterns of the heads it found."""

from __future__ import annotations

import numpy as np

from tmem.probes.heads import forward_with_attention


def heads_to_show(found: dict) -> list[tuple[list[int], str]]:
    """The classified heads with their role, or the best-scoring head of each kind when none passed."""
    roles, scores = found["roles"], found["scores"]
    shown = [(lh, "induction") for lh in roles["induction_heads"]]
    shown += [(lh, "previous-token") for lh in roles["previous_token_heads"]]
    for kind, key in (("induction", "induction"), ("previous-token", "previous_token")):
        if not any(role == kind for _, role in shown):
            best = [int(x) for x in np.unravel_index(np.argmax(scores[key]), scores[key].shape)]
            shown.append((best, f"best {kind} (not passing)"))
    return shown


def attention_figure(model, found: dict, example: int = 0):
    """Each shown head's pattern on one [BOS] + R + R sequence of the longest probe period.

    An induction head lights the stripe one right of the period's diagonal; a
    previous-token head the first sub-diagonal.
    """
    from matplotlib.figure import Figure

    period = max(found["probes"])
    tokens = found["probes"][period][example:example + 1]
    _, A = forward_with_attention(model, tokens)
    A = np.asarray(A)[:, 0]  # [depth, H, T, T]
    shown = heads_to_show(found)
    scores = found["scores"]
    cols = min(len(shown), 4)
    rows = -(-len(shown) // cols)
    fig = Figure(figsize=(3.2 * cols, 3.4 * rows + 0.3))
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[len(shown):]:
        ax.set_axis_off()
    for ax, ((layer, h), role) in zip(axes, shown):
        ax.imshow(A[layer, h], cmap="viridis", vmin=0, vmax=1)
        ax.set_title(f"L{layer}H{h}: {role}\ninduction {scores['induction'][layer, h]:.2f}, "
                     f"prev {scores['previous_token'][layer, h]:.2f}", fontsize=8)
        ax.set_xlabel("key position", fontsize=8)
        ax.set_ylabel("query position", fontsize=8)
        ax.tick_params(labelsize=6)
    fig.suptitle(f"attention on [BOS] + R + R, period {period}", fontsize=9)
    fig.tight_layout()
    return fig
