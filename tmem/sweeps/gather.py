"""Any finished multirun as one CSV: each job's summary.json beside its overrides, and the best job per group; or,
with --seeds, one row per configuration with its seeds folded into n, median, min and max.

    python -m tmem.sweeps.gather multirun/<date>/<time> [more dirs] [--by mixer,model.width] [--out jobs.csv]
    python -m tmem.sweeps.gather multirun/<date>/<time> [more dirs] --seeds [--out seeds.csv]
    python -m tmem.sweeps.gather multirun/<date>/<time> --seeds --eval eval/<overrides>  # another eval report

A job is a folder holding summary.json beside .hydra/ (Hydra writes the
job's overrides in .hydra/overrides.yaml). The CSV has one row per job: its
directory, every override key swept or set on its command line, and every
field of its summary (nested sections as dotted columns: `recipe.lr`). Jobs
are grouped by their sweep directory and the values of the `--by` override
keys (none: one group per sweep), and the best job of each group is marked
and printed, judged by each job's own target metric (`--metric` to choose
another) in the direction its task scores it.

With --seeds a configuration is a job's overrides less `train.seed`, across
every root given (seeds run in separate sweeps fold together), and each
numeric field becomes F:median, F:min, F:max and, from six seeds, the
median's 95% interval F:ci_lo, F:ci_hi (tmem/sweeps/seeds.py). A run that
did not reach its target counts in n but not in n_reached, its steps to the
target as at least its budget: `>=N` marks a statistic that is such a bound.

A damaged job (summary.json cut short, an unreadable overrides file) is
named in one line on stderr and skipped; an existing output is kept unless
--force. The figure commands (tmem.sweeps.figures, recall_curves,
slow_memory) read jobs with the functions here.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, NamedTuple

from tmem.sweeps.command import check_file, command_parser, fail, missing, nothing_under, to_csv
from tmem.sweeps.runs import REPORT, budget, find_runs, read_each, read_job
from tmem.sweeps.seeds import AtLeast, Job, fold, interval_rank, label, varying

FIRST = ["sweep", "job", "best"]  # the CSV's leading columns; overrides, then the summary's fields follow
SEED = "train.seed"


def read(run_dir: Path, report: str = REPORT) -> Job:
    """A job, with its eval.py report's fields from the folder `report` under it (eval, or eval/<task
    overrides>) as report.<probe>.<field>, so probes' numbers fold over seeds as training's do."""
    given, fields = read_job(run_dir, report)
    return Job(str(run_dir), given, fields, budget(run_dir, fields))


def jobs(roots: list[str | Path], report: str = REPORT) -> list[Job]:
    """Every finished job under the roots that reads (with its eval report in folder `report`, where it has one);
    damaged ones are named on stderr and skipped."""
    return read_each(find_runs(roots), lambda run_dir: read(run_dir, report))


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


def gather(roots: list[str | Path], by: tuple[str, ...] = (), metric: str | None = None,
           report: str = REPORT) -> Gathered:
    """Every job's row, and the best job of each group (its sweep directory and the values of `by`)."""
    found, rows, keys, fields = jobs(roots, report), [], {}, {}
    for job in found:
        keys.update(dict.fromkeys(job.overrides))
        fields.update(dict.fromkeys(job.fields))
        rows.append({"sweep": str(Path(job.run_dir).parent), "job": Path(job.run_dir).name, **job.overrides,
                     **job.fields})
    name = (lambda r: metric) if metric else (lambda r: r.get("target_metric"))
    best = mark_best(rows, group=lambda r: (r["sweep"], *(r.get(k) for k in by)),
                     value=lambda r: r.get(name(r)) if name(r) else None,
                     higher=lambda r: higher_is_better(r, name(r) or ""))
    swept = {sweep: [k for k in keys if len({r.get(k) for r in rows if r["sweep"] == sweep}) > 1]
             for sweep in dict.fromkeys(r["sweep"] for r in rows)}
    return Gathered(rows, list(dict.fromkeys([*FIRST, *keys, *fields])), swept, best, by)


class Folded(NamedTuple):
    rows: list[dict]  # one per configuration (seeds.fold)
    columns: list[str]  # the configuration's override keys, n, n_reached, seeds, status, then F:stat per field
    keys: list[str]  # the override keys whose values differ between configurations: what names a row


def fold_seeds(found: list[Job], over: str = SEED) -> Folded:
    """The jobs folded over `over` into one row per configuration, across every root they came from."""
    rows = fold(found, over)
    keys = list(dict.fromkeys(k for j in found for k in j.overrides if k != over))
    fields = list(dict.fromkeys(k for r in rows for k in r if ":" in k))
    if not any(interval_rank(r["n"]) for r in rows):
        fields = [f for f in fields if not f.endswith((":ci_lo", ":ci_hi"))]  # no configuration has six seeds
    texts = list(dict.fromkeys(k for r in rows for k in r if ":" not in k and k not in keys))
    return Folded(rows, [*keys, *texts, *fields], varying(rows, keys))


def number(v) -> str:
    if isinstance(v, AtLeast):
        return str(v)
    return "" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


def spread(row: dict, field: str, show: Callable[[Any], str] = number) -> str:
    """`median [min-max]` of a folded field, blank where no job reported it."""
    if row.get(f"{field}:median") is None:
        return ""
    lo, hi = row[f"{field}:min"], row[f"{field}:max"]
    return f"{show(row[f'{field}:median'])} [{show(lo)}-{show(hi)}]" if lo != hi else show(lo)


def seed_table(folded: Folded, metric: str | None = None) -> list[str]:
    """A readable table: a line per configuration, n, how many reached the target, and the spread of the steps
    and seconds to it and of the target metric (or `metric`)."""
    rows = folded.rows
    metric = metric or next((r.get("target_metric") for r in rows if r.get("target_metric")), "eval/accuracy")
    head = ["configuration", "n", "reached", "steps to target", "seconds to target", metric]
    cells = [[label(r, folded.keys), str(r["n"]), f"{r['n_reached']}/{r['n']}" if "n_reached" in r else "",
              spread(r, "target_step"), spread(r, "target_seconds"), spread(r, metric)] for r in rows]
    widths = [max(len(c[i]) for c in [head, *cells]) for i in range(len(head))]
    return ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in [head, *cells]]


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
    parser = command_parser(__doc__)
    parser.add_argument("--by", default="", help="override keys whose values split a sweep into groups, "
                                                 "comma-separated (default: one group per sweep)")
    parser.add_argument("--metric", help="summary field to rank by (default: each job's target metric)")
    parser.add_argument("--seeds", action="store_true", help=f"one row per configuration, its seeds ({SEED}) "
                                                            "folded into n, median, min and max")
    parser.add_argument("--out", help="the CSV to write (default: <first root>/jobs.csv, or seeds.csv with --seeds)")
    parser.add_argument("--eval", metavar="FOLDER", default=REPORT,
                        help="the folder under each job whose eval.py report.json is read as report.<probe>.<field> "
                             "(default eval; eval/<task overrides> for a run read on a changed task)")
    args = parser.parse_args(argv)
    name = "seeds.csv" if args.seeds else "jobs.csv"
    out = Path(args.out or Path(args.roots[0]) / name)
    problem = missing(args.roots) or check_file(out, args.force, name)
    if problem:
        return fail(problem)
    if args.seeds:
        return write_seeds(args, out)
    found = gather(args.roots, tuple(k for k in args.by.split(",") if k), args.metric, args.eval)
    if not found.rows:
        return fail(nothing_under(args.roots), 1)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(to_csv(found.rows, found.columns))
    print(f"{len(found.rows)} jobs in {len(found.swept)} sweeps; the best job of each of {len(found.best)} groups:")
    for line in report(found, args.metric):
        print(f"  {line}")
    print(f"csv: {out}")
    return 0


def write_seeds(args, out: Path) -> int:
    found = jobs(args.roots, args.eval)
    if not found:
        return fail(nothing_under(args.roots), 1)
    folded = fold_seeds(found)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(to_csv(folded.rows, folded.columns))
    sweeps = len({str(Path(j.run_dir).parent) for j in found})
    print(f"{len(found)} jobs in {sweeps} sweep{'s' * (sweeps > 1)} folded over {SEED} into {len(folded.rows)} "
          f"configurations (by their other overrides, across every root); median [min-max], >=: not reached:")
    for line in seed_table(folded, args.metric):
        print(f"  {line}")
    print(f"csv: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
