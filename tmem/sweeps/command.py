"""What every sweep command shares: its roots checked, its outputs checked before anything is read or written
(a folder where a file goes, or the reverse, and an existing file without --force, are one line each), and the
figure commands' one shape: gather, draw, write a PNG and an SVG beside the CSV of exactly the plotted numbers.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path
from typing import Any, Callable, NamedTuple


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


def _blocked_parent(path: Path) -> str | None:
    for parent in path.parents:
        if parent.exists():
            return None if parent.is_dir() else f"error: {parent} is a file, so nothing can be written under it"
    return None


def check_file(path: Path, force: bool, example: str) -> str | None:
    """The error line when `path` cannot or may not be written as a file, else None."""
    if path.is_dir():
        return f"error: --out {path} is a folder; name the file to write (e.g. {path / example})"
    if path.exists() and not force:
        return f"error: {path} exists; add --force to overwrite it"
    return _blocked_parent(path)


def check_folder(folder: Path, names: list[str], force: bool) -> str | None:
    """The error line when the files `names` cannot or may not be written in `folder`, else None."""
    if folder.exists() and not folder.is_dir():
        return f"error: --out {folder} is a file; name a folder for {', '.join(names)}"
    for name in names:
        if (folder / name).is_dir():
            return f"error: {folder / name} is a folder; move it or choose another --out"
    there = [name for name in names if (folder / name).exists()]
    if there and not force:
        return f"error: {folder} already holds {', '.join(there)}; add --force to overwrite"
    return _blocked_parent(folder)


def fail(line: str, code: int = 2) -> int:
    print(line, file=sys.stderr)
    return code


class Drawn(NamedTuple):
    rows: list[dict[str, Any]]  # exactly the numbers plotted, one CSV row each
    columns: list[str]
    figure: Any  # a matplotlib Figure (no pyplot state)


def command_parser(doc: str) -> argparse.ArgumentParser:
    """A sweep command's parser: the roots it reads and --force."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("roots", nargs="+", help="sweep directories (searched recursively for finished runs)")
    parser.add_argument("--force", action="store_true", help="overwrite outputs that exist")
    return parser


def gather_command(argv, name: str, doc: str, draw: Callable[[argparse.Namespace], Drawn | None],
                   options: Callable[[argparse.ArgumentParser], None] = lambda parser: None):
    """The command line of a figure: roots and options parsed, `<name>.csv`, `.png` and `.svg` checked, then
    `draw(args)` (None or no rows: nothing finished under the roots) and the three files written.

    Returns (exit code, the drawn rows, the output folder); problems get one line on stderr.
    """
    parser = command_parser(doc)
    parser.add_argument("--out", help=f"the folder for {name}.csv, .png and .svg (default: the first root)")
    options(parser)
    args = parser.parse_args(argv)
    out = Path(args.out or args.roots[0])
    files = [f"{name}.csv", f"{name}.png", f"{name}.svg"]
    problem = missing(args.roots) or check_folder(out, files, args.force)
    if problem:
        return fail(problem), [], None
    drawn = draw(args)
    if drawn is None:
        return fail(nothing_under(args.roots), 1), [], None
    if not drawn.rows:
        return fail(f"error: the finished runs under {', '.join(args.roots)} hold nothing {name} plots", 1), [], None
    out.mkdir(parents=True, exist_ok=True)
    (out / files[0]).write_text(to_csv(drawn.rows, drawn.columns))
    for file in files[1:]:
        drawn.figure.savefig(out / file, dpi=120)
    return 0, drawn.rows, out
