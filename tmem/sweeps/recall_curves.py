"""Zoology's figure from a sweep: held-out MQAR accuracy against width, one line per mixer, over seeds.

    python train.py -m experiment=recall_curves train.seed=0,1,2    # configs/experiment/recall_curves.yaml
    python -m tmem.sweeps.recall_curves multirun/<date>/<time> [more sweep dirs] [--out DIR] [--force]

Gathers every finished run under the given directories (a run is a folder
holding summary.json and .hydra/config.yaml) and draws `recall_curves.png`
and `.svg`: one panel per sequence length and number of key-value pairs,
accuracy against model width, one line per memory (the mixer; a sliding
window or a hybrid stack is its own line, `softmax w8`,
`gated_deltanet+softmax`: tmem.sweeps.runs.memory). Each point is a cell's
median over its seeds, its bar their min to max; where a cell was also swept
over another setting such as the learning rate, the point is the
configuration (the run's overrides less train.seed) with the best median
(Zoology plots the best of four learning rates). `recall_curves.csv` holds
exactly those points: each cell's chosen configuration and rate, n, its
seeds and the accuracy's median, min and max.
"""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import OmegaConf

from tmem.sweeps.command import Drawn, gather_command
from tmem.sweeps.gather import SEED
from tmem.sweeps.runs import find_runs, memory, overrides, read_each, summary
from tmem.sweeps.seeds import order_statistics

CELL = ("mixer", "width", "seq_len", "num_kv_pairs")
COLUMNS = [*CELL, "lr", "n", "seeds", "accuracy", "accuracy_min", "accuracy_max", "parameters", "state_size",
           "configuration"]


def read_run(run_dir: Path, metric: str = "eval/accuracy") -> dict:
    """One row from a run's summary and composed config."""
    fields = summary(run_dir)
    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    setting = " ".join(f"{k}={v}" for k, v in sorted(overrides(run_dir).items()) if k != SEED)
    return {
        "mixer": memory(cfg), "width": int(cfg.model.width), "seq_len": int(cfg.task.seq_len),
        "num_kv_pairs": int(cfg.task.get("num_kv_pairs", 0)),
        "lr": trained_rate(fields, cfg),
        "seed": int(cfg.train.seed), "accuracy": fields.get(metric), "loss": fields.get("eval/loss"),
        "status": fields.get("status"), "steps": fields.get("steps"),
        "wall_seconds": fields.get("wall_seconds"), "parameters": fields.get("parameters"),
        "state_size": fields.get("state_size"), "configuration": setting, "run_dir": str(run_dir),
    }


def trained_rate(fields: dict, cfg) -> float:
    """The rate a run trained at: its summary's recipe (optim.lr, or the row's), or, in a summary written before
    the summary had one, the composed config's optim.lr, else the row's under its name then or now."""
    if fields.get("recipe.lr") is not None:
        return float(fields["recipe.lr"])
    mixer = cfg.get("mixer") or {}
    rate = cfg.optim.get("lr") if "optim" in cfg else None
    return float(rate if rate is not None else (mixer.get("recipe") or {}).get("lr", mixer.get("lr")))


def gather(roots: list[str | Path]) -> list[dict]:
    """A row for every run with an accuracy; damaged runs are named on stderr and skipped."""
    rows = [r for r in read_each(find_runs(roots), read_run) if r["accuracy"] is not None]
    return sorted(rows, key=lambda r: (r["seq_len"], r["num_kv_pairs"], r["mixer"], r["width"], r["lr"], r["seed"]))


def cells(rows: list[dict]) -> list[dict]:
    """Each cell's point: its runs folded over seeds in every configuration (the overrides less the seed: a rate,
    a gate), and the configuration whose median is highest."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((*(r[c] for c in CELL), r["configuration"]), []).append(r)
    best: dict[tuple, dict] = {}
    for (*cell, setting), runs in groups.items():
        accuracy = order_statistics([r["accuracy"] for r in runs], [False] * len(runs))
        point = {**dict(zip(CELL, cell)), "lr": runs[0]["lr"], "configuration": setting, "n": len(runs),
                 "seeds": ",".join(str(r["seed"]) for r in sorted(runs, key=lambda r: r["seed"])),
                 "accuracy": accuracy["median"], "accuracy_min": accuracy["min"], "accuracy_max": accuracy["max"],
                 "parameters": runs[0]["parameters"], "state_size": runs[0]["state_size"]}
        if tuple(cell) not in best or point["accuracy"] > best[tuple(cell)]["accuracy"]:
            best[tuple(cell)] = point
    return sorted(best.values(), key=lambda p: (p["seq_len"], p["num_kv_pairs"], p["mixer"], p["width"]))


def figure(points: list[dict]):
    """One panel per (seq_len, kv): each cell's median accuracy against width with its seeds' min to max, a line
    per mixer."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    panels = sorted({(p["seq_len"], p["num_kv_pairs"]) for p in points})
    mixers = sorted({p["mixer"] for p in points}, key=lambda m: (m != "softmax", m))
    colors = {m: colormaps["tab10"](i % 10) for i, m in enumerate(mixers)}
    fig = Figure(figsize=(max(3.4 * len(panels), 6.0), 3.6))  # one panel: room for the title
    axes = fig.subplots(1, max(len(panels), 1), squeeze=False, sharey=True)
    for ax, (T, kv) in zip(axes[0], panels):
        for m in mixers:
            line = sorted((p for p in points if (p["seq_len"], p["num_kv_pairs"], p["mixer"]) == (T, kv, m)),
                          key=lambda p: p["width"])
            if line:
                median = [p["accuracy"] for p in line]
                ax.errorbar([p["width"] for p in line], median, fmt="o-", color=colors[m], label=m, capsize=2,
                            yerr=[[a - p["accuracy_min"] for a, p in zip(median, line)],
                                  [p["accuracy_max"] - a for a, p in zip(median, line)]])
        ax.set(xscale="log", xlabel="model width", title=f"seq len {T}, {kv} kv pairs", ylim=(-0.02, 1.05))
        widths = sorted({p["width"] for p in points})
        ax.set_xticks(widths, [str(w) for w in widths])
        ax.minorticks_off()
    n = sorted({p["n"] for p in points})
    seeds = f"{n[0]}" if len(n) == 1 else f"{n[0]}-{n[-1]}"
    axes[0, 0].set_ylabel(f"held-out accuracy (median of {seeds} seeds)")
    axes[0, -1].legend(fontsize=8, loc="lower right")
    fig.suptitle("MQAR recall against width (Zoology's figure 2); bars: min to max over seeds", fontsize=10)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    def draw(args) -> Drawn | None:
        points = cells(gather(args.roots))
        return Drawn(points, COLUMNS, figure(points)) if points else None

    code, points, out = gather_command(argv, "recall_curves", __doc__, draw)
    if code == 0:
        print(f"{len(points)} cells, each the median of its seeds at its best rate")
        print(f"csv:    {out / 'recall_curves.csv'}")
        print(f"figure: {out / 'recall_curves.png'}, .svg")
    return code


if __name__ == "__main__":
    sys.exit(main())
