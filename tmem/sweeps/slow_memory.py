"""How many facts a trained MLP holds, per score function and kind of MLP: the memorize sweep, gathered.

    python train.py -m experiment=memorize                   # the sweep (configs/experiment/memorize.yaml)
    python -m tmem.sweeps.slow_memory multirun/<date>/<time> [--out DIR]

Reads every finished memorize run under the directories (summary.json beside
.hydra/config.yaml) and writes `slow_memory.csv`, `.png` and `.svg`: facts
stored (argmax correct over the facts themselves) and bits per parameter
(facts x log2 of the value vocabulary over the MLP's parameters) against the
MLP's parameters, one line per score function (or per mixture of experts and
product-key memory, with the parameters a token uses, `active_params`,
beside all of them), and for a dense MLP the random-key
capacity of the same read at the model width (Chapter 5's exact-moment
theory; SwiGLU with its gate tied to its keys). A memory of m hidden units
holds at most m random pairs that way, so the random-key count is
min(m, capacity). A run counts as converged when it stored every fact or
gained under 1% of the facts over its last quarter (from its checkpoints).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from omegaconf import OmegaConf

from tmem.config import parse_group
from tmem.memory.capacity import capacity_theory
from tmem.mlps import CONFIGS, DenseConfig, MLPConfig, MoEConfig, PKMConfig
from tmem.mlps.dense import hidden_units
from tmem.sweeps.command import Drawn, gather_command
from tmem.sweeps.runs import find_runs, read_each, summary
from tmem.train.checkpoint import Checkpoints

# the score function of an MLP -> the store of the capacity table with the same read
READ_OF_SCORE = {"linear": "hebbian", "relu": "relu", "relu2": "relu2", "relu3": "relu3", "gelu": "gelu",
                 "swiglu": "swiglu"}
COLUMNS = ["score", "width", "hidden", "active_params", "mlp_params", "num_facts", "num_values", "chance_facts",
           "facts_stored", "accuracy", "bits_per_param", "random_key_capacity", "random_key_facts", "status", "steps",
           "gain_last_quarter", "converged", "wall_seconds", "run_dir"]


def label(mlp: MLPConfig) -> str:
    """A line of the figure: the score function of a dense MLP, or the mixture's or memory's shape."""
    if isinstance(mlp, MoEConfig):
        return f"moe {mlp.score} top{mlp.top_k}/{mlp.experts}"
    if isinstance(mlp, PKMConfig):
        return f"pkm {mlp.keys}^2 top{mlp.top_k}"
    return mlp.name


def _accuracy_history(run_dir: Path) -> dict[int, float]:
    if not (run_dir / "checkpoints").is_dir():
        return {}
    ckpts = Checkpoints(run_dir / "checkpoints")
    return {s: ckpts.metrics(s).get("eval/accuracy") for s in ckpts.steps()}


def read_run(run_dir: Path) -> dict | None:
    """One row for a memorize run, or None for any other run."""
    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    if cfg.task.name != "memorize" or cfg.mlp.name == "none":
        return None
    fields = summary(run_dir)
    d, mlp = int(cfg.model.width), parse_group("mlp", CONFIGS[cfg.mlp.name], cfg.mlp)
    active, params = mlp.parameters(d)
    dense = isinstance(mlp, DenseConfig)
    hidden = hidden_units(mlp.expansion, d) if dense else None
    F, n_values = int(cfg.task.num_facts), int(cfg.task.num_values)
    accuracy = float(fields["eval/accuracy"])
    stored = int(round(accuracy * F))
    history = {s: a for s, a in _accuracy_history(run_dir).items() if a is not None}
    steps = sorted(history)
    gain = None
    if len(steps) >= 2:
        quarter = [s for s in steps if s <= steps[-1] * 3 / 4]
        if quarter:
            gain = int(round((history[steps[-1]] - history[quarter[-1]]) * F))
    cap = capacity_theory(READ_OF_SCORE[mlp.name], d) if dense else None
    return {
        "score": label(mlp), "width": d, "hidden": hidden, "active_params": active, "mlp_params": params,
        "num_facts": F,
        "num_values": n_values, "chance_facts": F / n_values, "facts_stored": stored, "accuracy": accuracy,
        "bits_per_param": stored * math.log2(n_values) / params,
        "random_key_capacity": None if cap is None else round(cap, 1),
        "random_key_facts": None if cap is None else int(min(hidden, cap)),
        "status": fields.get("status"), "steps": fields.get("steps"), "gain_last_quarter": gain,
        "converged": stored == F or (gain is not None and gain < 0.01 * F),
        "wall_seconds": fields.get("wall_seconds"), "run_dir": str(run_dir),
    }


def gather(roots) -> list[dict]:
    rows = [r for r in read_each(find_runs(roots), read_run) if r is not None]
    return sorted(rows, key=lambda r: (r["score"], r["mlp_params"]))


def figure(rows: list[dict]):
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.8))
    ax_f, ax_b = fig.subplots(1, 2)
    scores = sorted({r["score"] for r in rows})
    for i, s in enumerate(scores):
        rs = sorted((r for r in rows if r["score"] == s), key=lambda r: r["mlp_params"])
        p = [r["mlp_params"] for r in rs]
        c = colormaps["tab10"](i % 10)
        ax_f.plot(p, [max(r["facts_stored"], 0.8) for r in rs], "o-", color=c, label=s)
        if rs[0]["random_key_facts"] is not None:
            ax_f.plot(p, [r["random_key_facts"] for r in rs], "--", color=c, lw=0.8, marker="o", mfc="none", ms=4)
        if any(r["active_params"] != r["mlp_params"] for r in rs):  # the same facts at the parameters a token uses
            ax_f.plot([r["active_params"] for r in rs], [max(r["facts_stored"], 0.8) for r in rs], "^", color=c,
                      mfc="none", ms=6)
        ax_b.plot(p, [r["bits_per_param"] for r in rs], "o-", color=c, label=s)
        for r in rs:
            if not r["converged"]:
                ax_f.plot(r["mlp_params"], max(r["facts_stored"], 0.8), "x", color="k", ms=7)
    if rows:
        ax_f.axhline(rows[0]["num_facts"], color="k", ls=":", lw=1)
        ax_f.axhline(rows[0]["chance_facts"], color="grey", ls=":", lw=1)
    ax_f.set(xscale="log", yscale="log", xlabel="MLP parameters", ylabel="facts stored (argmax correct)",
             title="trained (solid; triangles: at active parameters) vs random keys,\nmin(m, capacity) (dashed); "
                   "dotted: all facts, chance")
    ax_b.set(xscale="log", xlabel="MLP parameters", ylabel="bits per parameter",
             title=f"facts x log2({rows[0]['num_values'] if rows else 'V'}) / parameters")
    ticks = sorted({r["mlp_params"] for r in rows})
    for ax in (ax_f, ax_b):
        ax.set_xticks(ticks, [str(t) for t in ticks], fontsize=7, rotation=45)
        ax.minorticks_off()
    ax_f.legend(fontsize=8, loc="upper left")
    ax_f.title.set_fontsize(9)
    ax_b.title.set_fontsize(9)
    fig.suptitle("The slow memory: a one-block MLP storing a random map (x: not converged)", fontsize=10)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    def draw(args) -> Drawn | None:
        rows = gather(args.roots)
        return Drawn(rows, COLUMNS, figure(rows)) if rows else None

    code, rows, out = gather_command(argv, "slow_memory", __doc__, draw)
    if code:
        return code
    for r in rows:
        size = f"hidden {r['hidden']:>4}" if r["hidden"] is not None else f"active {r['active_params']:>5}"
        print(f"{r['score']:>7} {size} params {r['mlp_params']:>6}: {r['facts_stored']:>5} facts, "
              f"{r['bits_per_param']:.2f} bits/param (random keys {r['random_key_facts']})"
              f"{'' if r['converged'] else ' (not converged)'}")
    print(f"csv:    {out / 'slow_memory.csv'}")
    print(f"figure: {out / 'slow_memory.png'}, .svg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
