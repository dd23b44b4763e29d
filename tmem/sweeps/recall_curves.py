"""Zoology's figure from a sweep: held-out MQAR accuracy against width, one line per mixer.

    python train.py -m experiment=recall_curves          # the sweep (configs/experiment/recall_curves.yaml)
    python -m tmem.sweeps.recall_curves multirun/<date>/<time> [more sweep dirs] [--out DIR]

Gathers every finished run under the given directories (a run is a folder
holding summary.json and .hydra/config.yaml), writes `recall_curves.csv` (one
row per run) and `recall_curves.png` (one panel per sequence length and
number of key-value pairs, accuracy against model width, one line per mixer,
each point the best run of its cell over the other swept settings such as
the learning rate, as Zoology plots the best of four learning rates).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

from tmem.sweeps.gather import find_runs, gather_command, mark_best

COLUMNS = ["mixer", "width", "seq_len", "num_kv_pairs", "lr", "seed", "accuracy", "loss", "status", "steps",
           "wall_seconds", "parameters", "state_size", "best", "run_dir"]
CELL = ("mixer", "width", "seq_len", "num_kv_pairs")


def read_run(run_dir: Path, metric: str = "eval/accuracy") -> dict:
    """One CSV row from a run's summary and composed config."""
    summary = json.loads((run_dir / "summary.json").read_text())
    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    return {
        "mixer": cfg.mixer.name, "width": int(cfg.model.width), "seq_len": int(cfg.task.seq_len),
        "num_kv_pairs": int(cfg.task.get("num_kv_pairs", 0)),
        "lr": float(cfg.optim.lr if cfg.optim.lr is not None else cfg.mixer.lr),  # null: the mixer's rate
        "seed": int(cfg.train.seed), "accuracy": summary.get(metric), "loss": summary.get("eval/loss"),
        "status": summary.get("status"), "steps": summary.get("steps"),
        "wall_seconds": summary.get("wall_seconds"), "parameters": summary.get("parameters"),
        "state_size": summary.get("state_size"), "run_dir": str(run_dir),
    }


def gather(roots: list[str | Path]) -> list[dict]:
    """Rows for every run, each marked `best` when it has the top accuracy of its cell."""
    rows = [read_run(r) for r in find_runs(roots)]
    rows = [r for r in rows if r["accuracy"] is not None]
    mark_best(rows, group=lambda r: tuple(r[c] for c in CELL), value=lambda r: r["accuracy"], higher=lambda r: True)
    return sorted(rows, key=lambda r: (r["seq_len"], r["num_kv_pairs"], r["mixer"], r["width"], r["lr"], r["seed"]))


def figure(rows: list[dict]):
    """One panel per (seq_len, kv); accuracy of each cell's best run against width, a line per mixer."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    best = [r for r in rows if r["best"]]
    panels = sorted({(r["seq_len"], r["num_kv_pairs"]) for r in best})
    mixers = sorted({r["mixer"] for r in best}, key=lambda m: (m != "softmax", m))
    colors = {m: colormaps["tab10"](i % 10) for i, m in enumerate(mixers)}
    fig = Figure(figsize=(3.4 * max(len(panels), 1), 3.3))
    axes = fig.subplots(1, max(len(panels), 1), squeeze=False, sharey=True)
    for ax, (T, kv) in zip(axes[0], panels):
        for m in mixers:
            pts = sorted((r["width"], r["accuracy"]) for r in best if (r["seq_len"], r["num_kv_pairs"], r["mixer"])
                         == (T, kv, m))
            if pts:
                ax.plot(*zip(*pts), "o-", color=colors[m], label=m)
        ax.set(xscale="log", xlabel="model width", title=f"seq len {T}, {kv} kv pairs", ylim=(-0.02, 1.05))
        widths = sorted({r["width"] for r in best})
        ax.set_xticks(widths, [str(w) for w in widths])
        ax.minorticks_off()
    axes[0, 0].set_ylabel("held-out accuracy (best run)")
    axes[0, -1].legend(fontsize=8, loc="lower right")
    fig.suptitle("MQAR recall against width (Zoology's figure 2)", fontsize=10)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    code, rows, out = gather_command(argv, "recall_curves", __doc__, gather, figure, COLUMNS)
    if code == 0:
        print(f"{len(rows)} runs, {sum(r['best'] for r in rows)} cells")
        print(f"csv:    {out / 'recall_curves.csv'}")
        print(f"figure: {out / 'recall_curves.png'}")
    return code


if __name__ == "__main__":
    sys.exit(main())
