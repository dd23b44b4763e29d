"""Every row of the unified table on the default MQAR job, against softmax attention, in one process.

    python benchmarks/mqar_rows.py --skip-train             # training step of every row, as a ratio to softmax's
    python benchmarks/mqar_rows.py                          # and time to 99%, seeds 0 1 2
    python benchmarks/mqar_rows.py --rows softmax deltanet --seeds 0
    python benchmarks/mqar_rows.py --rows softmax ttt_linear hopfield mesa ttt_mlp titans   # the slow rows' goals

Each row runs with its own config (`mixer=<row>`), everything else the
default job. The steps of all rows are timed in turns, a few rounds each, and
each row's time is the median of its rounds: a load that comes and goes on a
shared machine then falls on every row alike, so the ratios hold. Time to 99%
is the training wall time, compile included, to the first held-out
evaluation at or above 0.99; the runs go seed by seed through all rows, for
the same reason. The persistent compilation cache is off: compile time counts.
The last table puts each row's step time, compile time and steps to 0.99
beside its time to 0.99, so a change of ratio shows whether the step, the
compile or the number of steps moved, and the rest: the time to 0.99 less
its steps at the timed step and one compile, which is the held-out
evaluations and whatever else a run spends; and per seed, the range of each
seed's time over the first row's on that seed: a median within that range of
its goal could fall on either side in another sitting.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)

import jax  # noqa: E402
from mqar_speed import compiled_step, config, time_to_target  # noqa: E402

from tmem.train.cluster import start  # noqa: E402

ROWS = ("softmax", "linear", "retnet", "mamba2", "deltanet", "gated_deltanet", "gla")
# the speed issue's goals for a training step, as a multiple of softmax attention's
STEP_GOAL = {"linear": 1.5, "retnet": 1.5, "mamba2": 1.5, "deltanet": 2.0, "gated_deltanet": 2.0, "gla": 2.0}
# time to 99% as a multiple of softmax's: 3 for the fast-weight rows; the test-time-regression rows', whose step
# does more arithmetic (a model trained or a system solved in the forward pass), their own
TIME_GOAL = {**dict.fromkeys(STEP_GOAL, 3.0), "ttt_linear": 3.0, "hopfield": 3.0, "mesa": 5.0, "ttt_mlp": 6.0,
             "titans": 8.0}


def step_times(rows, overrides, steps: int, rounds: int) -> dict[str, dict]:
    """Per row: compile seconds and the median over `rounds` turns of the mean step time, in ms."""
    return time_steps({row: config(f"mixer={row}", *overrides)[0] for row in rows}, steps, rounds)


def time_steps(cfgs: dict, steps: int, rounds: int) -> dict[str, dict]:
    """step_times for any named configs: each compiled once, then `steps` steps each in `rounds` turns."""
    programs = {}
    for row, cfg in cfgs.items():
        compiled, state, compile_s = compiled_step(cfg)
        for _ in range(5):  # warm: the first calls allocate
            state, _ = compiled(state)
        jax.block_until_ready(state)
        programs[row] = [compiled, state, compile_s, []]
    per_round = max(steps // rounds, 1)
    for _ in range(rounds):
        for row, p in programs.items():
            compiled, state = p[0], p[1]
            start = time.perf_counter()
            for _ in range(per_round):
                state, _ = compiled(state)
            jax.block_until_ready(state)
            p[3].append(1e3 * (time.perf_counter() - start) / per_round)
            p[1] = state
    return {row: {"compile_s": p[2], "step_ms": statistics.median(p[3]), "rounds_ms": p[3]}
            for row, p in programs.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", default=list(ROWS), help="softmax first: the ratios are to the first row")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=200, help="timed steps per row, over all rounds")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--skip-train", action="store_true", help="only the step times")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the default job, for every row")
    args = parser.parse_args()
    # `--rows` takes every word after it, so overrides written after the rows land there: move them back
    args.overrides += [word for word in args.rows if "=" in word]
    args.rows = [word for word in args.rows if "=" not in word]
    base = args.rows[0]
    start(config(f"mixer={base}", *args.overrides)[0])  # the devices train.py would train the first row on

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, jax {jax.__version__}, "
          f"{jax.device_count()} {jax.devices()[0].platform} devices; job: {' '.join(args.overrides) or 'default'}")
    speed = step_times(args.rows, args.overrides, args.steps, args.rounds)
    print(f"\n{'row':16s} {'step ms':>8s} {'x ' + base:>10s} {'goal':>6s} {'compile s':>10s}")
    for row, s in speed.items():
        ratio = s["step_ms"] / speed[base]["step_ms"]
        goal = STEP_GOAL.get(row)
        mark = "" if goal is None else f"{goal:5.1f}{'' if ratio <= goal else ' (not met)'}"
        print(f"{row:16s} {s['step_ms']:8.2f} {ratio:10.2f} {mark:>6s} {s['compile_s']:10.1f}")
    results = {"rows": speed}

    if not args.skip_train:
        runs = {row: [] for row in args.rows}
        for seed in args.seeds:  # seed by seed through every row: slow spells of a shared machine hit all rows
            for row in args.rows:
                cfg, resolved = config(f"mixer={row}", *args.overrides, f"train.seed={seed}")
                r = time_to_target(cfg, resolved)
                runs[row].append(r)
                print(f"{row} seed {seed}: 0.99 at step {r['target_step']} after {r['target_seconds']} s "
                      f"(final {r['eval/accuracy']:.4f} at step {r['steps']})", flush=True)
        print(f"\n{'row':16s} {'steps to 0.99':>22s} {'s to 0.99':>10s} {'x ' + base:>10s} {'goal':>5s}   "
              f"{'step ms':>8s} {'x ' + base:>10s} {'compile s':>10s} {'rest s':>7s} {'per seed':>11s}  "
              f"(medians over seeds {args.seeds})")
        medians = {}
        for row, rs in runs.items():
            seconds, steps = [r["target_seconds"] for r in rs], [r["target_step"] for r in rs]
            if None in seconds:
                print(f"{row:16s} not reached for every seed: steps {steps}")
                continue
            medians[row] = statistics.median(seconds)
            ratio = medians[row] / medians[base] if base in medians else float("nan")
            goal = TIME_GOAL.get(row)
            mark = "" if row == base or goal is None else f"{goal:5.1f}{'' if ratio <= goal else ' (not met)'}"
            s = speed[row]
            # what the timed step and one compile do not account for: the held-out evaluations, and anything
            # else a run spends (a second compile would show here)
            rest = statistics.median(r["target_seconds"] - r["target_step"] * s["step_ms"] / 1e3 - s["compile_s"]
                                     for r in rs)
            # each seed's time over the first row's on the same seed, run beside it: the spread says how far a
            # median near its goal could move in another sitting
            paired = [r["target_seconds"] / b["target_seconds"] for r, b in zip(rs, runs[base])
                      if b["target_seconds"]]
            spread = f"{min(paired):.2f}-{max(paired):.2f}" if paired and row != base else ""
            print(f"{row:16s} {statistics.median(steps):8.0f} {str(steps):>13s} {medians[row]:10.1f} {ratio:10.2f} "
                  f"{mark:>5s}   {s['step_ms']:8.2f} {s['step_ms'] / speed[base]['step_ms']:10.2f} "
                  f"{s['compile_s']:10.1f} {rest:7.1f} {spread:>11s}")
        results["runs"] = runs
    print(json.dumps(results))


if __name__ == "__main__":
    main()
