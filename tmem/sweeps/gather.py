"""Any finished multirun as one CSV: each job's summary.json beside its overrides, and the best job per group.

    python -m tmem.sweeps.gather multirun/<date>/<time> [more dirs] [--by mixer,model.width] [--out jobs.csv]

A job is a folder holding summary.json beside .hydra/ (Hydra writes the
job's overrides in .hydra/overrides.yaml). The CSV has one row per job: its
directory, every override key swept or set on its command line, and every
field of its summary. Jobs are grouped by their sweep directory and the
values of the `--by` override keys (none: one group per sweep), and the best
job of each group is marked and printed, judged by each job's own target
metric (`--metric` to choose another) in the direction its task scores it.

The figure gatherers (recall_curves, slow_memory) find jobs and write their
tables with the functions here.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path
from typing import Any, Callable, NamedTuple

from omegaconf import OmegaConf

FIRST = ["sweep", "job", "best"]  # the CSV's leading columns; overrides, then the summary's fields follow


def find_runs(roots: list[str | Path]) -> list[Path]:
    """Every finished run under the roots: a folder with summary.json beside .hydra/config.yaml."""
    runs = set()
    for root in map(Path, roots):
        for summary in root.rglob("summary.json"):
            if (summary.parent / ".hydra" / "config.yaml").exists():
                runs.add(summary.parent)
    return sorted(runs)


def overrides(run_dir: Path) -> dict[str, str]:
    """A job's command-line overrides as key -> value text (`model.width=64` -> {"model.width": "64"}).

    Hydra records them in .hydra/overrides.yaml, the swept values of a
    multirun's job among them; a run without the file has none.
    """
    path = run_dir / ".hydra" / "overrides.yaml"
    lines = OmegaConf.to_container(OmegaConf.load(path)) if path.is_file() else []
    pairs = (str(line).lstrip("+~").split("=", 1) for line in lines or [])
    return {key: value for key, value, *_ in (pair + [""] for pair in pairs)}


def read_job(run_dir: Path) -> tuple[dict[str, str], dict[str, Any]]:
    """A job's overrides and its summary's fields (the scalar ones: every field tmem writes)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    return overrides(run_dir), {k: v for k, v in summary.items() if not isinstance(v, (dict, list))}


def higher_is_better(row: dict, metric: str) -> bool:
    """The direction a job's metric improves in: the summary's own word for its target metric, else by name.

    Summaries from before `higher_is_better` was recorded are judged by name:
    losses fall, every other metric tmem reports (accuracies) rises.
    """
    if metric == row.get("target_metric") and row.get("higher_is_better") is not None:
        return bool(row["higher_is_better"])
    return not metric.rsplit("/", 1)[-1].endswith("loss")


def mark_best(rows: list[dict], group: Callable[[dict], tuple], value: Callable[[dict], float | None],
              higher: Callable[[dict], bool]) -> dict[tuple, dict]:
    """Set each row's `best` (the top `value` of its `group`) and return the best row of every group.

    Rows without a value are never best; a group of only such rows has none.
    """
    best: dict[tuple, dict] = {}
    for r in rows:
        v = value(r)
        if v is None:
            continue
        g = group(r)
        if g not in best or (v > value(best[g]) if higher(r) else v < value(best[g])):
            best[g] = r
    for r in rows:
        r["best"] = best.get(group(r)) is r
    return best


class Gathered(NamedTuple):
    rows: list[dict]  # one per job: sweep, job, best, its overrides, its summary's fields
    columns: list[str]  # FIRST, the override keys, the summary's fields, each in first-seen order
    swept: dict[str, list[str]]  # sweep directory -> the override keys whose values differ among its jobs
    best: dict[tuple, dict]  # (sweep, *values of `by`) -> that group's best row
    by: tuple[str, ...]  # the override keys that split a sweep into groups


def gather(roots: list[str | Path], by: tuple[str, ...] = (), metric: str | None = None) -> Gathered:
    """Every job's row, and the best job of each group (its sweep directory and the values of `by`)."""
    rows, keys, fields = [], {}, {}
    for run_dir in find_runs(roots):
        given, summary = read_job(run_dir)
        keys.update(dict.fromkeys(given))
        fields.update(dict.fromkeys(summary))
        rows.append({"sweep": str(run_dir.parent), "job": run_dir.name, **given, **summary})
    name = (lambda r: metric) if metric else (lambda r: r.get("target_metric"))
    best = mark_best(rows, group=lambda r: (r["sweep"], *(r.get(k) for k in by)),
                     value=lambda r: r.get(name(r)) if name(r) else None,
                     higher=lambda r: higher_is_better(r, name(r) or ""))
    swept = {sweep: [k for k in keys if len({r.get(k) for r in rows if r["sweep"] == sweep}) > 1]
             for sweep in dict.fromkeys(r["sweep"] for r in rows)}
    return Gathered(rows, list(dict.fromkeys([*FIRST, *keys, *fields])), swept, best, by)


def to_csv(rows: list[dict], columns: list[str]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def missing(roots: list[str]) -> str | None:
    """The one error line for roots that are not directories, else None."""
    absent = [r for r in roots if not Path(r).is_dir()]
    return f"error: no such directory: {', '.join(absent)}" if absent else None


def nothing_under(roots: list[str]) -> str:
    return f"error: no finished runs (summary.json beside .hydra/config.yaml) under {', '.join(roots)}"


def gather_command(argv, name: str, doc: str, gather_fn, figure_fn, columns: list[str]):
    """The command line of a figure gatherer: read the roots, write `<name>.csv` and `<name>.png`.

    Returns (exit code, rows, output folder); problems get one line on stderr.
    """
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("roots", nargs="+", help="sweep directories (searched recursively for finished runs)")
    parser.add_argument("--out", help=f"where {name}.csv and .png go (default: the first root)")
    args = parser.parse_args(argv)
    if missing(args.roots):
        print(missing(args.roots), file=sys.stderr)
        return 2, [], None
    rows = gather_fn(args.roots)
    if not rows:
        print(nothing_under(args.roots), file=sys.stderr)
        return 1, [], None
    out = Path(args.out or args.roots[0])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.csv").write_text(to_csv(rows, columns))
    figure_fn(rows).savefig(out / f"{name}.png", dpi=120)
    return 0, rows, out


def report(found: Gathered, metric: str | None = None) -> list[str]:
    """One line per group: the group, its best job and metric, and that job's swept values."""
    lines = []
    for key, r in sorted(found.best.items(), key=lambda kv: tuple(map(str, kv[0]))):
        name = metric or r["target_metric"]
        sweep, values = key[0], key[1:]
        where = sweep + "".join(f" {k}={v}" for k, v in zip(found.by, values) if v is not None)
        swept = " ".join(f"{k}={r.get(k)}" for k in found.swept[sweep] if k not in found.by)
        lines.append(f"{where}: job {r['job']}, {name}={r[name]:.4g}" + (f" ({swept})" if swept else ""))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("roots", nargs="+", help="multirun directories (searched recursively for finished jobs)")
    parser.add_argument("--by", default="", help="override keys whose values split a sweep into groups, "
                                                 "comma-separated (default: one group per sweep)")
    parser.add_argument("--metric", help="summary field to rank by (default: each job's target metric)")
    parser.add_argument("--out", help="the CSV to write (default: <first root>/jobs.csv)")
    args = parser.parse_args(argv)
    if missing(args.roots):
        print(missing(args.roots), file=sys.stderr)
        return 2
    found = gather(args.roots, tuple(k for k in args.by.split(",") if k), args.metric)
    if not found.rows:
        print(nothing_under(args.roots), file=sys.stderr)
        return 1
    out = Path(args.out or Path(args.roots[0]) / "jobs.csv")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(to_csv(found.rows, found.columns))
    print(f"{len(found.rows)} jobs in {len(found.swept)} sweeps; the best job of each of {len(found.best)} groups:")
    for line in report(found, args.metric):
        print(f"  {line}")
    print(f"csv: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
