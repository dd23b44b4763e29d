"""The README's table of rows from a sweep over seeds, as Markdown that names its command, commit and date.

    python train.py -m mixer=softmax,linear,retnet,mamba2,deltanet,gated_deltanet,gla train.seed=0,1,2 \
        hydra.sweep.dir=runs/rows
    python -m tmem.sweeps.table runs/rows [more dirs] [--base mixer=softmax] [--out rows.md] [--force]

One line per configuration (the jobs' overrides less train.seed): n, how
many seeds reached the target, steps and training seconds to it as median
[min-max] (`>=`: a seed that never reached it makes the value a lower bound),
the seconds' median over the median of the `--base` configuration that
differs from it only there (softmax's, in the same gather), parameters and
state size. Above the table: the sweep's command (from Hydra's
multirun.yaml), this command, the commits the runs record and the date the
last of them finished.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

from tmem.sweeps.command import check_file, command_parser, fail, missing, nothing_under
from tmem.sweeps.gather import fold_seeds, jobs, spread
from tmem.sweeps.seeds import AtLeast, Job


def sweep_commands(found: list[Job]) -> list[str]:
    """`python train.py -m ...` of each sweep the jobs came from, as Hydra recorded it in multirun.yaml."""
    commands = []
    for sweep in dict.fromkeys(Path(j.run_dir).parent for j in found):
        path = sweep / "multirun.yaml"
        try:
            task = OmegaConf.load(path).hydra.overrides.task
        except Exception:  # no record (a sweep made otherwise) or a damaged one: the sweep is named by its folder
            commands.append(f"(the jobs under {sweep})")
            continue
        commands.append(" ".join(["python train.py -m", *map(str, task), f"hydra.sweep.dir={sweep}"]))
    return commands


def commits(found: list[Job]) -> list[str]:
    """The commits the runs record (a `versions` section's commit or tmem version), in first-seen order."""
    keys = ("versions.commit", "versions.tmem", "versions.tmem_commit")
    return list(dict.fromkeys(str(j.fields[k]) for j in found for k in keys if j.fields.get(k)))


def finished(found: list[Job]) -> str:
    latest = max((Path(j.run_dir) / "summary.json").stat().st_mtime for j in found)
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(latest))


def ratio(row: dict, base: dict | None, field: str = "target_seconds:median") -> str:
    """row's median over base's: a lower bound where row's is one, unknown where base's is."""
    mine, theirs = row.get(field), (base or {}).get(field)
    if mine is None or theirs is None or isinstance(theirs, AtLeast) or not theirs:
        return ""
    return f"{'>=' if isinstance(mine, AtLeast) else ''}{mine / theirs:.2f}"


def markdown(found: list[Job], base: str = "mixer=softmax", command: str = "") -> str:
    folded = fold_seeds(found)
    key, _, value = base.partition("=")
    keys = folded.keys or [key]
    index = {tuple(str(r.get(k)) for k in keys): r for r in folded.rows}

    def base_of(row):  # the configuration that differs from `row` only in `key`, set to `value`
        return index.get(tuple(value if k == key else str(row.get(k)) for k in keys))

    target = next((j.fields["target_value"] for j in found if j.fields.get("target_value") is not None), "target")
    recorded = commits(found)
    lines = ["Sweep: " + "; ".join(f"`{c}`" for c in sweep_commands(found)),
             *([f"Table: `{command}`"] if command else []),
             f"Commit: {', '.join(recorded) if recorded else 'not recorded by the runs'}; "
             f"last run finished {finished(found)}.", "",
             f"| {', '.join(keys)} | n | reached | steps to {target} | seconds to {target} | x {value} | parameters "
             "| state size |", "|---|---|---|---|---|---|---|---|"]
    for r in folded.rows:
        reached = f"{r['n_reached']}/{r['n']}" if "n_reached" in r else ""
        lines.append(f"| {' '.join(str(r.get(k)) for k in keys)} | {r['n']} | {reached} "
                     f"| {spread(r, 'target_step', whole)} | {spread(r, 'target_seconds', tenths)} "
                     f"| {ratio(r, base_of(r))} | {whole(r.get('parameters:median'))} "
                     f"| {whole(r.get('state_size:median'))} |")
    return "\n".join(lines) + "\n"


def rounded(digits: int):
    """A cell's text at `digits` decimals, `>=` before a lower bound."""
    return lambda v: "" if v is None else f"{'>=' if isinstance(v, AtLeast) else ''}{v:.{digits}f}"


whole, tenths = rounded(0), rounded(1)


def main(argv: list[str] | None = None) -> int:
    parser = command_parser(__doc__)
    parser.add_argument("--base", default="mixer=softmax", help="the configuration the seconds are a ratio to, as "
                                                                "key=value (default: mixer=softmax)")
    parser.add_argument("--out", help="also write the table to this Markdown file")
    args = parser.parse_args(argv)
    if "=" not in args.base:
        return fail(f"error: --base {args.base}: give key=value, e.g. --base mixer=softmax")
    out = Path(args.out) if args.out else None
    problem = missing(args.roots) or (check_file(out, args.force, "rows.md") if out else None)
    if problem:
        return fail(problem)
    found = jobs(args.roots)
    if not found:
        return fail(nothing_under(args.roots), 1)
    command = " ".join(["python -m tmem.sweeps.table", *(argv if argv is not None else sys.argv[1:])])
    text = markdown(found, args.base, command)
    print(text, end="")
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
