"""A/B of the training step between two versions of tmem, interleaved in one sitting.

    python benchmarks/ab_step.py --base bee913c                 # that commit against the working tree
    python benchmarks/ab_step.py --base bee913c --rounds 7 mixer=deltanet

Each round runs `benchmarks/mqar_speed.py --skip-train` of the base commit (a
temporary git worktree) and of the candidate (the working tree, or --new), one
after the other, each in a fresh process importing its own tree's code. The
two alternate, so both see the same load on a shared machine; the ratio of the
medians and each round's ratio are printed. A refactor that costs no speed
gives a ratio near 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def step_ms(tree: Path, overrides: list[str]) -> float:
    """The step time mqar_speed.py of `tree` measures, with `tree`'s own package first on the path."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    # the overrides go first: --seeds takes every number after it
    done = subprocess.run([sys.executable, str(tree / "benchmarks" / "mqar_speed.py"), *overrides, "--skip-train",
                           "--seeds", "0"], cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{tree}: mqar_speed.py failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["step_ms"]


def imports_from(tree: Path) -> Path:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", "import tmem; print(tmem.__file__)"], cwd=tree, env=env,
                         capture_output=True, text=True, check=True).stdout
    return Path(out.strip()).parent.parent


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare against")
    parser.add_argument("--new", default=None, help="a commit to measure (default: the working tree)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the default job")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        trees = {}
        for label, rev in (("base", args.base), ("new", args.new)):
            if rev is None:
                trees[label] = ROOT
                continue
            trees[label] = Path(tmp) / label
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(trees[label]), rev],
                           check=True, capture_output=True)
        try:
            for label, tree in trees.items():
                found = imports_from(tree)
                if found != tree.resolve():
                    sys.exit(f"{label}: python imports tmem from {found}, not {tree}")
            times = {label: [] for label in trees}
            for r in range(args.rounds):
                for label, tree in trees.items():
                    times[label].append(step_ms(tree, args.overrides))
                print(f"round {r}: base {times['base'][-1]:.2f} ms, new {times['new'][-1]:.2f} ms, "
                      f"new / base {times['new'][-1] / times['base'][-1]:.3f}", flush=True)
        finally:
            for label, tree in trees.items():
                if tree != ROOT:
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                                   capture_output=True)
    base, new = (statistics.median(times[k]) for k in ("base", "new"))
    print(f"job: {' '.join(args.overrides) or 'default'}; base {args.base}, new {args.new or 'working tree'}")
    print(f"median step: base {base:.2f} ms, new {new:.2f} ms; new / base {new / base:.3f}")


if __name__ == "__main__":
    main()
