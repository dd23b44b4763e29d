"""A capacity law from a sweep over memory sizes: MQAR pairs recalled against state size, one power law per kind of
memory, its seeds' median with min and max.

    python -m tmem.sweeps.capacity_law DIR [more dirs] [--out FOLDER] [--force]

Reads the runs as `tmem.sweeps.recall_curves` does (a run's memory named by
`tmem.sweeps.runs.memory`) and folds each configuration's seeds. A kind of
memory is its write rule, a window's size being a size: `softmax w8` and
`softmax` are one kind, caches of 7 and of T tokens, as `deltanet` at widths
16 and 32 is one kind with states of 4 x 4 and 8 x 8 a head. Pairs recalled
are held-out accuracy x pairs, since MQAR scores one query per pair.

Per kind and task the law is recalled = a * state^b, fitted by least squares
in log-log over the points whose median accuracy is under 0.99: a point at
0.99 says only that its state is enough, and would bend the line. Each law
also gives the state at which it reaches every pair, (P / a)^(1/b), an
extrapolation when no point of the kind got there. The chapter 3 reading: a
d_k x d_v outer-product store recalls about d_k pairs a head, so recalled
pairs grow as the square root of a fixed-size state (b = 1/2); a cache
recalls a pair when the key is still in it, so a window's recall grows
linearly with its state (b = 1) until the window spans the pairs.

`capacity_law.csv` holds the plotted points (mark `point`) and one row per
law (mark `law`: a, b and the state for every pair).
"""

from __future__ import annotations

import math
import re
import sys

from tmem.sweeps.command import Drawn, gather_command
from tmem.sweeps.recall_curves import gather
from tmem.sweeps.seeds import order_statistics

SATURATED = 0.99  # a median accuracy at or above this is "the state suffices", left out of the fit
COLUMNS = ["mark", "kind", "memory", "seq_len", "num_kv_pairs", "width", "state_size", "n", "seeds", "accuracy",
           "accuracy_min", "accuracy_max", "recalled", "recalled_min", "recalled_max", "fitted", "a", "b",
           "state_for_all", "configuration"]


def kind(memory: str) -> str:
    """The write rule of a memory named by tmem.sweeps.runs.memory: its layers with their window sizes dropped."""
    return re.sub(r" w\d+", "", memory)


def power_law(sizes: list[float], values: list[float]) -> tuple[float, float] | None:
    """(a, b) of values = a * sizes^b by least squares on the logarithms; None without two distinct sizes or with a
    value that is not positive."""
    if len(set(sizes)) < 2 or min(values) <= 0:
        return None
    xs, ys = [math.log(s) for s in sizes], [math.log(v) for v in values]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return math.exp(my - b * mx), b


def points(rows: list[dict]) -> list[dict]:
    """One point per configuration (the run's overrides less its seed): the median, min and max of accuracy and of
    pairs recalled over its seeds, at its state size."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["mixer"], r["seq_len"], r["num_kv_pairs"], r["width"], r["configuration"]), []).append(r)
    out = []
    for (memory, seq_len, pairs, width, setting), runs in groups.items():
        acc = order_statistics([r["accuracy"] for r in runs], [False] * len(runs))
        out.append({"mark": "point", "kind": kind(memory), "memory": memory, "seq_len": seq_len,
                    "num_kv_pairs": pairs, "width": width, "state_size": runs[0]["state_size"], "n": len(runs),
                    "seeds": ",".join(str(r["seed"]) for r in sorted(runs, key=lambda r: r["seed"])),
                    "accuracy": acc["median"], "accuracy_min": acc["min"], "accuracy_max": acc["max"],
                    "recalled": acc["median"] * pairs, "recalled_min": acc["min"] * pairs,
                    "recalled_max": acc["max"] * pairs, "fitted": acc["median"] < SATURATED,
                    "configuration": setting})
    return sorted(out, key=lambda p: (p["seq_len"], p["num_kv_pairs"], p["kind"], p["state_size"] or 0))


def laws(found: list[dict]) -> list[dict]:
    """Each kind's law at each task, fitted over its unsaturated points; a kind with fewer than two such sizes has
    none (its points still show)."""
    out = []
    for key in dict.fromkeys((p["kind"], p["seq_len"], p["num_kv_pairs"]) for p in found):
        fit = [p for p in found if (p["kind"], p["seq_len"], p["num_kv_pairs"]) == key and p["fitted"]
               and p["state_size"]]
        law = power_law([p["state_size"] for p in fit], [p["recalled"] for p in fit])
        if law:
            a, b = law
            out.append({"mark": "law", "kind": key[0], "seq_len": key[1], "num_kv_pairs": key[2], "n": len(fit),
                        "a": a, "b": b, "state_for_all": (key[2] / a) ** (1 / b) if b > 0 else None})
    return out


def figure(found: list[dict], fitted: list[dict]):
    """One panel per task: pairs recalled (median, bar min to max over seeds) against state size, log-log, a colour
    per kind, its law dashed over the sizes it was fitted on and a dotted line at every pair."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    tasks = sorted({(p["seq_len"], p["num_kv_pairs"]) for p in found})
    kinds = list(dict.fromkeys(p["kind"] for p in found))
    colors = {k: colormaps["tab10"](i % 10) for i, k in enumerate(kinds)}
    fig = Figure(figsize=(5.8 * len(tasks), 4.0))
    axes = fig.subplots(1, len(tasks), squeeze=False)[0]
    for ax, (T, P) in zip(axes, tasks):
        for k in kinds:
            line = [p for p in found if (p["kind"], p["seq_len"], p["num_kv_pairs"]) == (k, T, P) and p["state_size"]]
            law = next((w for w in fitted if (w["kind"], w["seq_len"], w["num_kv_pairs"]) == (k, T, P)), None)
            if not line:
                continue
            label = k if law is None else f"{k}: {law['a']:.2g} S^{law['b']:.2f}"
            ax.errorbar([p["state_size"] for p in line], [p["recalled"] for p in line], fmt="o-", color=colors[k],
                        capsize=2, label=label, yerr=[[p["recalled"] - p["recalled_min"] for p in line],
                                                      [p["recalled_max"] - p["recalled"] for p in line]])
            if law:
                sizes = [p["state_size"] for p in line if p["fitted"]]
                xs = [min(sizes), max(sizes)]
                ax.plot(xs, [law["a"] * x ** law["b"] for x in xs], "--", color=colors[k], lw=1)
        ax.axhline(P, color="grey", ls=":", lw=1)
        ax.set(xscale="log", yscale="log", xlabel="state size (elements per sequence, all layers)",
               ylabel="pairs recalled (accuracy x pairs)", title=f"MQAR, seq len {T}, {P} pairs")
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"pairs recalled (median; bars: min to max over seeds)\ndashed: the law fitted below {SATURATED} "
                 "accuracy; dotted: every pair", fontsize=9)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    def draw(args) -> Drawn | None:
        rows = gather(args.roots)
        if not rows:
            return None
        found = points(rows)
        fitted = laws(found)
        return Drawn(found + fitted, COLUMNS, figure(found, fitted))

    code, drawn, out = gather_command(argv, "capacity_law", __doc__, draw)
    if code == 0:
        for law in (r for r in drawn if r["mark"] == "law"):
            every = f"{law['state_for_all']:.0f}" if law["state_for_all"] else "never"
            print(f"{law['kind']} (T={law['seq_len']}, {law['num_kv_pairs']} pairs): recalled = {law['a']:.3g} "
                  f"* state^{law['b']:.3f} over {law['n']} sizes; every pair at state {every}")
        print(f"csv:    {out / 'capacity_law.csv'}")
        print(f"figure: {out / 'capacity_law.png'}, .svg")
    return code


if __name__ == "__main__":
    sys.exit(main())
