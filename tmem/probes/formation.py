"""When induction heads form: probe every saved checkpoint of a run and read off the steps.

The formation step is the first checkpoint from which the best head's
induction score (averaged over the probe periods) stays at or above the
threshold for `hold` consecutive checkpoints; a single lucky checkpoint does
not count. The loss-drop step is the end of the interval between checkpoints
where the held-out loss falls fastest, the phase change of Olsson et al.
"""

from __future__ import annotations

from typing import Callable

import numpy as np


def formation_step(steps, scores, threshold: float = 0.4, hold: int = 3) -> int | None:
    """First step from which `scores` is >= threshold at `hold` consecutive checkpoints, else None."""
    ok = np.asarray(scores) >= threshold
    for i in range(len(ok) - hold + 1):
        if ok[i:i + hold].all():
            return int(steps[i])
    return None


def steepest_drop(steps, losses) -> dict | None:
    """The interval between consecutive checkpoints with the most negative loss slope (per step)."""
    steps, losses = np.asarray(steps, float), np.asarray(losses, float)
    keep = np.isfinite(losses)
    steps, losses = steps[keep], losses[keep]
    if len(steps) < 2:
        return None
    slope = np.diff(losses) / np.diff(steps)
    i = int(np.argmin(slope))
    if slope[i] >= 0:
        return None  # the loss never fell
    return {"from_step": int(steps[i]), "to_step": int(steps[i + 1]), "loss_before": float(losses[i]),
            "loss_after": float(losses[i + 1]), "slope_per_step": float(slope[i])}


def _nanmax(x) -> float | None:
    x = np.asarray(x, float)
    return None if np.all(np.isnan(x)) else float(np.nanmax(x))


def formation(models, measure: Callable, *, held_out_loss: Callable[[int], float | None] = lambda step: None,
              threshold: float = 0.4, hold: int = 3) -> dict:
    """Probe each (step, model) in `models` with `measure(model) -> dict` and find the formation step.

    `models` is any iterable of (step, model), such as a run's `history.models()`
    (ProbeInput.history), which restores one checkpoint at a time.
    `measure` returns at least `induction` [depth, H] (averaged over periods),
    `previous_token` [depth, H], `second_copy_loss` and the memory probes
    `wo1`, `wk1`, `wk0` [depth, H], and may return `k_composition` [H, H] (kept
    whole per step); `held_out_loss(step)` is the run's own held-out loss at that
    checkpoint, when it was recorded.
    """
    series = {k: [] for k in ("steps", "best_induction_score", "induction", "max_previous_token_score",
                              "second_copy_loss", "held_out_loss", "wo1", "wk1", "wk0", "k_composition")}
    for step, model in models:
        m = measure(model)
        depth = m["induction"].shape[0]
        upper = slice(1, None) if depth > 1 else slice(None)  # where an induction head can sit
        lower = slice(None, -1) if depth > 1 else slice(None)  # where its previous-token head can
        series["steps"].append(int(step))
        series["induction"].append(np.asarray(m["induction"]).tolist())
        series["best_induction_score"].append(float(np.max(m["induction"])))
        series["max_previous_token_score"].append(float(np.max(m["previous_token"][lower])))
        series["second_copy_loss"].append(float(m["second_copy_loss"]))
        series["held_out_loss"].append(held_out_loss(step))
        series["wo1"].append(_nanmax(m["wo1"][upper]))
        series["wk1"].append(_nanmax(m["wk1"][upper]))
        series["wk0"].append(_nanmax(m["wk0"][lower]))
        series["k_composition"].append(np.asarray(m["k_composition"]).tolist() if "k_composition" in m else None)
    loss = [np.nan if v is None else v for v in series["held_out_loss"]]
    loss_name = "held_out_loss"
    if np.all(np.isnan(loss)):
        loss, loss_name = series["second_copy_loss"], "second_copy_loss"
    drop = steepest_drop(series["steps"], loss)
    return {
        **series,
        "threshold": threshold,
        "hold": hold,
        "formation_step": formation_step(series["steps"], series["best_induction_score"], threshold, hold),
        "loss_drop": drop,
        "loss_drop_measured_on": loss_name,
        "loss_drop_step": None if drop is None else drop["to_step"],
    }


def formation_figure(f: dict):
    """Scores and loss against step, with the formation and loss-drop steps marked."""
    from matplotlib.figure import Figure

    steps = f["steps"]
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    ax.plot(steps, f["best_induction_score"], "o-", color="C0", lw=2, ms=3, label="best induction score")
    ax.plot(steps, f["max_previous_token_score"], "-", color="C1", label="best previous-token score")
    for name, style in (("wo1", ":"), ("wk1", "-."), ("wk0", "--")):
        values = [np.nan if v is None else v for v in f[name]]
        if not np.all(np.isnan(values)):
            ax.plot(steps, values, style, color="0.4", lw=1, label=f"memory recall {name}")
    ax.axhline(f["threshold"], color="C0", lw=0.6, ls=":")
    if f["formation_step"] is not None:
        ax.axvline(f["formation_step"], color="C0", lw=1, ls="--")
        ax.annotate(f"formed at {f['formation_step']}", (f["formation_step"], 1.02), color="C0", fontsize=8,
                    ha="center")
    ax.set(xlabel="training step", ylabel="score / accuracy", ylim=(-0.02, 1.08))
    right = ax.twinx()
    loss = [np.nan if v is None else v for v in f[f["loss_drop_measured_on"]]]
    right.plot(steps, loss, color="C3", lw=1.2, label=f"{f['loss_drop_measured_on'].replace('_', ' ')}")
    right.plot(steps, f["second_copy_loss"], color="C3", lw=0.8, ls=":", label="probe second-copy loss")
    if f["loss_drop_step"] is not None:
        right.axvline(f["loss_drop_step"], color="C3", lw=0.8, ls="--")
    right.set_ylabel("loss (nats)", color="C3")
    lines = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    labels = ax.get_legend_handles_labels()[1] + right.get_legend_handles_labels()[1]
    ax.legend(lines, labels, fontsize=7, loc="center right")
    ax.set_title("induction-head formation over training")
    fig.tight_layout()
    return fig
