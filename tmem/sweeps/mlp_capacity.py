"""Which property of a trained MLP predicts how many facts it holds: the memorize sweep's `mlp_keys` reports, a power
law fitted per property on some score functions and tested on the others.

    python train.py -m experiment=memorize mlp=relu,relu2,gelu mlp.expansion=0.5,1,2 train.seed=0,1,2
    python eval.py -m run=<each run> 'probes=[mlp_keys]'       # the properties, per run: eval/report.json
    python -m tmem.sweeps.mlp_capacity DIR [more dirs] --fit relu,relu2 [--out FOLDER] [--force]

Reads every run under the directories with an `mlp_keys` section in
`eval/report.json`. For each property p the tmem.probes.mlp_keys probe
measured (and the hidden units m, the size a property must beat), it fits
facts = alpha * p^beta by least squares in log-log over every run of the
`--fit` score functions, and scores it twice: R^2 of log facts on those runs,
and the median |relative error| of its prediction on the runs of every other
score function, settings it never saw. A property that is zero or negative in
some run (no biases: a spread of 0) is not fitted, and says so.

`mlp_capacity.csv` holds each run's facts and properties (mark `run`) and each
predictor (mark `predictor`); the figure draws facts against every fitted
property, a colour per score, held-out runs hollow, each law as a line.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

from omegaconf import OmegaConf

from tmem.sweeps.capacity_law import power_law
from tmem.sweeps.command import Drawn, gather_command
from tmem.sweeps.runs import Damaged, read_each

PROPERTIES = ["hidden", "key_rank", "key_coherence", "key_coherence_max", "code_rank", "code_units", "bias_spread"]
COLUMNS = ["mark", "score", "expansion", "seed", "facts_stored", *PROPERTIES, "property", "alpha", "beta", "r2_fit",
           "heldout_error", "n_fit", "n_heldout", "note", "run_dir"]


def find_reports(roots: list[str | Path]) -> list[Path]:
    return sorted({p.parent.parent for root in map(Path, roots) for p in root.rglob("eval/report.json")
                   if (p.parent.parent / ".hydra" / "config.yaml").exists()})


def read_run(run_dir: Path) -> dict | None:
    """A run's score function, width, seed, facts stored and properties; None where no mlp_keys report is."""
    try:
        report = json.loads((run_dir / "eval" / "report.json").read_text())
    except json.JSONDecodeError as e:
        raise Damaged(f"{run_dir / 'eval' / 'report.json'}: not JSON ({e.msg})") from None
    keys = report.get("mlp_keys")
    if not isinstance(keys, dict):
        return None
    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    return {"mark": "run", "score": cfg.mlp.name, "expansion": float(cfg.mlp.expansion), "seed": int(cfg.train.seed),
            "facts_stored": keys["facts_stored"], **{p: keys.get(p) for p in PROPERTIES}, "run_dir": str(run_dir)}


def predictors(runs: list[dict], fit: set[str]) -> list[dict]:
    """Per property: the law fitted on the runs of the `fit` scores, its R^2 there, its median |relative error| on
    the others."""
    train = [r for r in runs if r["score"] in fit]
    test = [r for r in runs if r["score"] not in fit]
    out = []
    for p in PROPERTIES:
        row = {"mark": "predictor", "property": p, "n_fit": len(train), "n_heldout": len(test)}
        values = [r[p] for r in runs]
        if any(v is None or v <= 0 for v in values) or not train:
            out.append({**row, "note": "not fitted: a run has no positive value"})
            continue
        law = power_law([r[p] for r in train], [r["facts_stored"] for r in train])
        if law is None:
            out.append({**row, "note": "not fitted: one value over the fitted runs"})
            continue
        alpha, beta = law
        logs = [math.log(r["facts_stored"]) for r in train]
        residual = sum((y - math.log(alpha * r[p] ** beta)) ** 2 for y, r in zip(logs, train))
        total = sum((y - statistics.fmean(logs)) ** 2 for y in logs)
        errors = [abs(alpha * r[p] ** beta / r["facts_stored"] - 1) for r in test]
        out.append({**row, "alpha": alpha, "beta": beta, "r2_fit": 1 - residual / total if total else None,
                    "heldout_error": statistics.median(errors) if errors else None})
    return out


def figure(runs: list[dict], laws: list[dict], fit: set[str]):
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    fitted = [w for w in laws if w.get("alpha") is not None]
    scores = list(dict.fromkeys(r["score"] for r in runs))
    colors = {s: colormaps["tab10"](i % 10) for i, s in enumerate(scores)}
    fig = Figure(figsize=(3.2 * max(len(fitted), 1), 3.3))
    axes = fig.subplots(1, max(len(fitted), 1), squeeze=False, sharey=True)[0]
    for ax, law in zip(axes, fitted):
        p = law["property"]
        for s in scores:
            mine = [r for r in runs if r["score"] == s]
            ax.scatter([r[p] for r in mine], [r["facts_stored"] for r in mine], s=16, label=s,
                       facecolors=colors[s] if s in fit else "none", edgecolors=colors[s])
        xs = sorted(r[p] for r in runs)
        ax.plot([xs[0], xs[-1]], [law["alpha"] * x ** law["beta"] for x in (xs[0], xs[-1])], "k--", lw=1)
        held = "" if law["heldout_error"] is None else f", held-out error {law['heldout_error']:.0%}"
        ax.set(xscale="log", yscale="log", xlabel=p, title=f"R^2 {law['r2_fit']:.2f}{held}")
        ax.title.set_fontsize(8)
    axes[0].set_ylabel("facts stored")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"facts stored against each property; fitted on {', '.join(sorted(fit))} (filled), "
                 "held out hollow", fontsize=9)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    def options(parser):
        parser.add_argument("--fit", required=True, help="the score functions to fit on, comma-separated (relu,relu2)")

    def draw(args) -> Drawn | None:
        runs = [r for r in read_each(find_reports(args.roots), read_run) if r is not None]
        if not runs:
            return None
        fit = set(args.fit.split(","))
        laws = predictors(runs, fit)
        return Drawn(runs + laws, COLUMNS, figure(runs, laws, fit))

    code, rows, out = gather_command(argv, "mlp_capacity", __doc__, draw, options)
    if code == 0:
        for law in (r for r in rows if r["mark"] == "predictor"):
            if law.get("alpha") is None:
                print(f"{law['property']}: {law['note']}")
                continue
            held = "" if law["heldout_error"] is None else f", median error {law['heldout_error']:.1%} held out"
            print(f"{law['property']}: facts = {law['alpha']:.3g} * p^{law['beta']:.3f}, R^2 {law['r2_fit']:.3f} "
                  f"on {law['n_fit']} runs{held} ({law['n_heldout']} runs)")
        print(f"csv:    {out / 'mlp_capacity.csv'}")
    return code


if __name__ == "__main__":
    sys.exit(main())
