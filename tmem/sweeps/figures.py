"""The standard figures of a finished sweep over seeds, one command each: PNG and SVG beside a CSV of exactly the
plotted numbers.

    python -m tmem.sweeps.figures curves DIR [more dirs] [--metric eval/accuracy] [--out FOLDER] [--force]
    python -m tmem.sweeps.figures steps DIR ...      # steps to the target per configuration, every seed
    python -m tmem.sweeps.figures state DIR ...      # state size against the target metric
    python -m tmem.sweeps.figures report DIR ... --metric 'keys_move.steps.*.layer1.cos'   # a probe's curve

A configuration is a job's overrides less train.seed (tmem.sweeps.gather
--seeds), named in the figures by the overrides that differ between
configurations (`mixer=linear`). `curves`: each configuration's learning
curve from its jobs' metrics.jsonl, the median over seeds with a band from
min to max, at the steps every seed logged (learning_curves.*). `steps`:
each seed's steps to the target as a point, the median as a bar; a seed
that never reached the target is drawn at its budget as an open triangle,
and a median such a seed reaches is a lower bound, dashed
(steps_to_target.*). `state`: the median of the target metric (or
--metric) against the state size, min to max as a bar, a line per value of
the first differing override (state_size.*). `report`: a probe's curve from
each job's eval report (`python eval.py run=<job> ...` first), the fields
--metric names with `*` for the x (comma-separated for several), median and
min-max band over seeds (report_curves.*). Zoology's figure 2 is
`python -m tmem.sweeps.recall_curves`.

The figures are bare matplotlib Figures, so notebooks call the same
functions (`learning_curves`, `steps_to_target`, `state_size`) on
`tmem.sweeps.gather.jobs(roots)`.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Callable

from tmem.sweeps import runs
from tmem.sweeps.command import Drawn, fail, gather_command
from tmem.sweeps.gather import SEED, fold_seeds, jobs
from tmem.sweeps.seeds import AtLeast, Job, band, configuration, label, to_target


def series_names(found: list[Job]) -> Callable[[Job], str]:
    """A job's configuration's name: its values of the overrides that differ between configurations."""
    keys = fold_seeds(found).keys
    return lambda job: label(dict(configuration(job, SEED)), keys)


def _metric(found: list[Job], metric: str | None) -> str:
    return metric or next((j.fields["target_metric"] for j in found if j.fields.get("target_metric")),
                          "eval/accuracy")


def series_colors(names: list[str]) -> dict[str, tuple]:
    from matplotlib import colormaps

    return {n: colormaps["tab10"](i % 10) for i, n in enumerate(names)}


def learning_curves(found: list[Job], metric: str | None = None) -> Drawn:
    """Each configuration's median curve over seeds and its min-max band, at the steps every seed logged.

    Jobs whose metrics.jsonl is damaged are named on stderr and left out;
    jobs without one (runs from before it was written) add no curve.
    """
    metric, name = _metric(found, metric), series_names(found)
    read = dict(runs.read_each([Path(j.run_dir) for j in found], lambda d: (str(d), runs.metrics(d))))
    without = sum(not lines for lines in read.values())
    if without:
        print(f"{without} of {len(found)} jobs have no metrics.jsonl (runs made before it was written): no curve",
              file=sys.stderr)
    curves: dict[str, list[dict[int, float]]] = {}
    for job in found:
        if read.get(job.run_dir):
            curves.setdefault(name(job), []).append(runs.curve(read[job.run_dir], metric))
    return _bands(curves, "step", metric, f"{metric}: median over seeds, band min to max")


def _bands(curves: dict[str, list[dict[float, float]]], xlabel: str, ylabel: str, title: str) -> Drawn:
    """Each named list of seeds' curves (x -> value) as its median line and min-max band, at the x every seed has."""
    from matplotlib.figure import Figure

    rows = [{"configuration": n, **point} for n, cs in curves.items() for point in band(cs)]
    fig = Figure(figsize=(5.5, 3.6))
    ax = fig.subplots()
    colors = series_colors(list(curves))
    for n in curves:
        points = [r for r in rows if r["configuration"] == n]
        if not points:
            continue
        steps = [p["step"] for p in points]
        ax.plot(steps, [p["median"] for p in points], color=colors[n], label=f"{n} (n={points[0]['n']})")
        ax.fill_between(steps, [p["min"] for p in points], [p["max"] for p in points], color=colors[n], alpha=0.2,
                        lw=0)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.title.set_fontsize(9)
    if rows:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return Drawn(rows, ["configuration", "step", "n", "median", "min", "max"], fig)


def report_curves(found: list[Job], fields: str) -> Drawn:
    """A probe's curve from the jobs' eval reports: `fields` names report fields with a `*` where the curve's x
    stands (`keys_move.steps.*.layer1.cos`: the value at each checkpoint), several comma-separated; each
    configuration's median over seeds and min-max band per field (x in the CSV's `step` column)."""
    patterns = {f: re.compile("report\\." + re.escape(f).replace("\\*", "(.+?)") + "$") for f in fields.split(",")}
    name, configurations = series_names(found), len(fold_seeds(found).rows)
    shared = os.path.commonprefix(list(patterns)).rsplit("*", 1)[0] if len(patterns) > 1 else ""
    curves: dict[str, list[dict[float, float]]] = {}
    for job in found:
        for field, pattern in patterns.items():
            points = {float(m.group(1)): float(v) for k, v in job.fields.items()
                      if (m := pattern.match(k)) and _number(m.group(1)) and isinstance(v, (int, float))}
            if points:  # named by what differs: the configuration, the field's part after the shared prefix
                parts = [name(job)] * (configurations > 1) + [field[len(shared):].lstrip("*.")] * (len(patterns) > 1)
                curves.setdefault(" ".join(parts) or name(job), []).append(points)
    return _bands(curves, f"x: the * of {next(iter(patterns))}", fields if len(patterns) == 1 else shared.rstrip("*."),
                  "median over seeds, band min to max")


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def steps_to_target(found: list[Job]) -> Drawn:
    """Every seed's steps to the target per configuration (at its budget, marked, where never reached) and their
    median (a lower bound where an unreached seed reaches it)."""
    from matplotlib.figure import Figure

    folded, name = fold_seeds(found), series_names(found)
    rows = []
    for job in found:
        target = to_target(job).get("target_step")
        if target is not None:
            rows.append({"configuration": name(job), "mark": "seed", "seed": job.overrides.get(SEED, ""),
                         "steps": target[0], "reached": not target[1]})
    for r in folded.rows:
        median = r.get("target_step:median")
        if median is not None:
            rows.append({"configuration": label(r, folded.keys), "mark": "median", "seed": "", "steps": median,
                         "reached": not isinstance(median, AtLeast)})
    names = list(dict.fromkeys(r["configuration"] for r in rows))
    fig = Figure(figsize=(max(4.0, 1.1 * len(names) + 1.5), 3.8))
    ax = fig.subplots()
    for x, n in enumerate(names):
        seeds = [r for r in rows if r["configuration"] == n and r["mark"] == "seed"]
        for i, r in enumerate(seeds):
            dx = 0.25 * (i / max(len(seeds) - 1, 1) - 0.5)  # spread the seeds apart, in a fixed order
            ax.plot(x + dx, r["steps"], "o" if r["reached"] else "^", mfc="C0" if r["reached"] else "none",
                    mec="C0", ms=6)
        for r in (r for r in rows if r["configuration"] == n and r["mark"] == "median"):
            ax.hlines(r["steps"], x - 0.3, x + 0.3, color="k", lw=2, ls="-" if r["reached"] else "--")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    target = next((j.fields.get("target_value") for j in found if j.fields.get("target_value") is not None), "")
    ax.set(xlim=(-0.6, len(names) - 0.4), ylabel=f"steps to {target}",
           title="o: a seed; open ^: not reached, drawn at its budget\nbar: the median (dashed: at least)")
    ax.title.set_fontsize(8)
    fig.tight_layout()
    return Drawn(rows, ["configuration", "mark", "seed", "steps", "reached"], fig)


def state_size(found: list[Job], metric: str | None = None) -> Drawn:
    """The median of `metric` (the jobs' target metric) over seeds against each configuration's state size, min to
    max as a bar; a line joins the configurations that share the first differing override's value."""
    from matplotlib.figure import Figure

    metric, folded = _metric(found, metric), fold_seeds(found)
    series = folded.keys[:1]
    rows = [{"configuration": label(r, folded.keys), "series": label(r, series), "state_size": r["state_size:median"],
             "n": r["n"], "median": r[f"{metric}:median"], "min": r[f"{metric}:min"], "max": r[f"{metric}:max"]}
            for r in folded.rows if r.get("state_size:median") is not None and r.get(f"{metric}:median") is not None]
    order = list(dict.fromkeys(r["series"] for r in rows))  # the sweep's order
    rows.sort(key=lambda r: (order.index(r["series"]), r["state_size"]))
    fig = Figure(figsize=(5.5, 3.6))
    ax = fig.subplots()
    colors = series_colors(list(dict.fromkeys(r["series"] for r in rows)))
    for s, color in colors.items():
        line = [r for r in rows if r["series"] == s]
        ax.errorbar([r["state_size"] for r in line], [r["median"] for r in line], fmt="o-", color=color, label=s,
                    capsize=2, yerr=[[r["median"] - r["min"] for r in line], [r["max"] - r["median"] for r in line]])
    ax.set(xscale="log", xlabel="state size (elements per sequence, all layers)",
           ylabel=f"{metric} (median over seeds)", title=f"{metric} against state size; bars: min to max over seeds")
    sizes = sorted({r["state_size"] for r in rows})
    ax.set_xticks(sizes, [f"{s:g}" for s in sizes])
    ax.minorticks_off()
    ax.title.set_fontsize(9)
    if rows:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return Drawn(rows, ["configuration", "series", "state_size", "n", "median", "min", "max"], fig)


FIGURES = {"curves": ("learning_curves", learning_curves, True), "steps": ("steps_to_target", steps_to_target, False),
           "state": ("state_size", state_size, True),
           "report": ("report_curves", report_curves, True)}  # command -> (file name, figure, takes --metric)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in FIGURES:
        given = f"{argv[0]!r} is not a figure; " if argv and not argv[0].startswith("-") else ""
        return fail(f"error: {given}name one of: {', '.join(FIGURES)} (python -m tmem.sweeps.figures curves DIR)")
    file, draw_fn, takes_metric = FIGURES[argv[0]]
    if argv[0] == "report" and not any(a.startswith("--metric") for a in argv):
        return fail("error: report needs --metric, the report fields with * for the x "
                    "(--metric 'keys_move.steps.*.layer1.cos')")

    def options(parser):
        if takes_metric:
            parser.add_argument("--metric", help="the summary or logged metric (default: the jobs' target metric)")

    def draw(args) -> Drawn | None:
        found = jobs(args.roots)
        return (draw_fn(found, args.metric) if takes_metric else draw_fn(found)) if found else None

    code, rows, out = gather_command(argv[1:], file, __doc__, draw, options)
    if code == 0:
        print(f"{len(rows)} plotted rows: {out / file}.csv, .png, .svg")
    return code


if __name__ == "__main__":
    sys.exit(main())
