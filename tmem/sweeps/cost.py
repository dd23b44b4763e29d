"""What a sweep will cost before it runs: its jobs' training FLOPs at their step caps.

    python -m tmem.sweeps.cost -m experiment=recall_curves                 # the sweep train.py -m would run
    python -m tmem.sweeps.cost -m experiment=recall_curves --tflops 200    # hours at an achieved rate

The jobs are the ones Hydra's basic sweeper would launch for the same command
line: the experiment's `hydra.sweeper.params` with the command's sweeps in
their place, crossed. Each job is composed and validated as train.py would
(so a bad cell is refused here, in one line), and its step counted by
`tmem.flops.step_flops`. The total is an upper bound: every job is counted to
its `train.steps`, where early stopping at the target ends most sooner, and
held-out evaluations are left out. Hours are the FLOPs over a rate the
caller states, since the rate a toy model reaches on a device is the
unknown that only a measurement gives (benchmarks/gpu.sh measures it).
"""

from __future__ import annotations

import argparse
import sys

from tmem.command import compose_command
from tmem.config import ConfigError, validate
from tmem.flops import step_flops

RATES = (10.0, 100.0)  # achieved TFLOP/s shown when the caller gives none: a loaded accelerator, a good one


def grid(args: list[str]) -> list[list[str]]:
    """Each job's override lines, crossed by Hydra's basic sweeper itself: the config's sweeper params, then
    the command's overrides, a later one replacing an earlier one of the same key."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = compose_command(args, sweeps=False).hydra.sweeper.get("params") or {}
    lines = [f"{key}={value}" for key, value in params.items()] + [a for a in args if not a.startswith("-")]
    return BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(lines), None)[0]


def job_flops(overrides: list[str]) -> tuple[float, int]:
    """(FLOPs of one training step, its step cap) of one job, validated as train.py validates it."""
    config = validate(compose_command(overrides))
    return step_flops(config)["total"], config.train.steps


def estimate(args: list[str]) -> tuple[list[tuple[list[str], float, int]], float]:
    """Every job with its step's FLOPs and cap, and the sweep's total FLOPs at the caps."""
    jobs = [(job, *job_flops(job)) for job in grid(args)]
    return jobs, sum(flops * steps for _, flops, steps in jobs)


def report(args: list[str], rates: tuple[float, ...] = RATES) -> str:
    jobs, total = estimate(args)
    swept = [line.split("=")[0] for line in jobs[0][0]]  # every job has the same keys, in the same order
    varying = [k for i, k in enumerate(swept) if len({job[i] for job, _, _ in jobs}) > 1]
    lines = [f"{len(jobs)} jobs; training FLOPs at each job's step cap (an upper bound: early stops end sooner)",
             "| " + " | ".join(varying) + " | GFLOPs a step | steps | TFLOPs |",
             "|" + "---|" * (len(varying) + 3)]
    for job, flops, steps in jobs:
        cells = [line.split("=", 1)[1] for line in job if line.split("=")[0] in varying]
        lines.append(f"| {' | '.join(cells)} | {flops / 1e9:,.2f} | {steps:,} | {flops * steps / 1e12:,.3g} |")
    lines.append(f"total {total / 1e15:.3g} PFLOPs: " + ", ".join(
        f"{total / (rate * 1e12) / 3600:.3g} h at {rate:g} TFLOP/s" for rate in rates))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tflops", type=float, action="append",
                        help="an achieved rate to state the hours at (repeatable)")
    known, overrides = parser.parse_known_args(argv)
    try:
        print(report(overrides, tuple(known.tflops or RATES)))
    except ConfigError as e:
        sys.exit(f"config error: {e}")


if __name__ == "__main__":
    main()
