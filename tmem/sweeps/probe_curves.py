"""A probe's curve over a sweep's seeds: each configuration's median and min-max band of a curve every job's
eval.py report holds (recall by distance, by distractor length), as PNG and SVG beside a CSV of the plotted numbers.

    python -m tmem.sweeps.probe_curves DIR [more dirs] --eval task.num_kv_pairs=16 \\
        --x mqar_distance.distance_low --y mqar_distance.accuracy [--y ...] [--logx] [--logy] [--name NAME] \\
        [--out FOLDER]

`--eval` names the report's folder under each job's `eval/` (the task
overrides eval.py was given, as it spells them; none: `eval/` itself);
`--x` and each `--y` are dotted paths to equal-length lists in its
report.json. A configuration is a job's overrides less train.seed, named by
the overrides that differ (tmem.sweeps.figures); each `--y` is a panel. A
job without the report, or whose report lacks a path, is named in one line
on stderr and left out; the rest are drawn.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from tmem.sweeps.command import Drawn, gather_command
from tmem.sweeps.figures import series_colors, series_names
from tmem.sweeps.gather import jobs
from tmem.sweeps.seeds import Job

COLUMNS = ["configuration", "y", "x", "n", "median", "min", "max"]


def lookup(report: dict, path: str) -> list:
    value = report
    for part in path.split("."):
        value = value[part]
    return list(value)


def curve(report: dict, x: str, y: str) -> dict[float, float]:
    xs, ys = lookup(report, x), lookup(report, y)
    if len(xs) != len(ys):
        raise ValueError(f"{x} has {len(xs)} values and {y} {len(ys)}")
    return dict(zip(xs, ys))


def probe_curves(found: list[Job], report: str, x: str, ys: list[str], logx: bool = False,
                 logy: bool = False) -> Drawn:
    """The median over seeds and the min and max of each `ys` curve at every x any seed reported."""
    from matplotlib.figure import Figure

    name, seeds = series_names(found), {}
    for job in found:
        path = Path(job.run_dir) / report
        try:
            read = json.loads(path.read_text())
            curves = {y: curve(read, x, y) for y in ys}  # all or none: a job adds to every panel or to none
            for y, c in curves.items():
                seeds.setdefault((name(job), y), []).append(c)
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"skipped: {path}: {type(e).__name__}: {e}", file=sys.stderr)
    rows = []
    for (configuration, y), curves in seeds.items():
        for at in sorted({v for c in curves for v in c}):
            values = [c[at] for c in curves if at in c]
            rows.append({"configuration": configuration, "y": y, "x": at, "n": len(values),
                         "median": statistics.median(values), "min": min(values), "max": max(values)})
    fig = Figure(figsize=(4.2 * len(ys) + 0.6, 3.4))
    axes = fig.subplots(1, len(ys), squeeze=False)[0]
    colors = series_colors(list(dict.fromkeys(r["configuration"] for r in rows)))
    for ax, y in zip(axes, ys):
        for n, color in colors.items():
            points = [r for r in rows if r["configuration"] == n and r["y"] == y]
            at = [p["x"] for p in points]
            ax.plot(at, [p["median"] for p in points], "o-", ms=3, color=color,
                    label=f"{n} (n={max((p['n'] for p in points), default=0)})")
            ax.fill_between(at, [p["min"] for p in points], [p["max"] for p in points], color=color, alpha=0.2, lw=0)
        ax.set(xlabel=x, ylabel=y, xscale="log" if logx else "linear", yscale="log" if logy else "linear",
               title=f"{y}: median over seeds, band min to max")
        if logx:  # the reported x values as plain ticks, not powers of ten
            at = sorted({r["x"] for r in rows if r["y"] == y})
            ax.set_xticks(at, [f"{v:g}" for v in at])
            ax.minorticks_off()
        ax.title.set_fontsize(8)
    if rows:
        axes[-1].legend(fontsize=7)
    fig.tight_layout()
    return Drawn(rows, COLUMNS, fig)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    name = argv[argv.index("--name") + 1] if "--name" in argv[:-1] else "probe_curves"

    def options(parser):
        parser.add_argument("--eval", default="", help="the report's folder under eval/ (eval.py's task overrides)")
        parser.add_argument("--x", required=True, help="dotted path in report.json to the x values")
        parser.add_argument("--y", required=True, action="append", help="dotted path to a curve (one panel each)")
        parser.add_argument("--logx", action="store_true", help="a logarithmic x axis")
        parser.add_argument("--logy", action="store_true", help="logarithmic y axes (ratios spanning decades)")
        parser.add_argument("--name", default=name, help="the output files' name (default probe_curves)")

    def draw(args) -> Drawn | None:
        found = jobs(args.roots)
        report = str(Path("eval", args.eval, "report.json"))
        return probe_curves(found, report, args.x, args.y, args.logx, args.logy) if found else None

    code, rows, out = gather_command(argv, name, __doc__, draw, options)
    if code == 0:
        print(f"{len(rows)} plotted rows: {out / name}.csv, .png, .svg")
    return code


if __name__ == "__main__":
    sys.exit(main())
