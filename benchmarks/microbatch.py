"""Each row's training step at several microbatch sizes, in one process: the data behind each row's mixer.recipe.microbatch.

    python benchmarks/microbatch.py                                   # every row of mqar_rows, sizes 8, 16, 32
    python benchmarks/microbatch.py --rows softmax gla --sizes 4 8 16
    python benchmarks/microbatch.py cluster.cpu_devices=1             # on one device over every core

A size is the examples each device differentiates at once; it changes only
how the batch's gradient is computed (the same update, tests/test_train.py),
so the fastest is a row's own default, `train.microbatch=auto`. Every (row,
size) pair is compiled first and then timed in turns, as in mqar_rows.py, so
a load that comes and goes falls on all of them alike. A size at or above a
device's part of the batch is that part at once. The devices are those
train.py trains the default job on (`cluster.cpu_devices`: one per core by
default).
"""

from __future__ import annotations

import argparse
import json

from mqar_rows import ROWS, time_steps
from mqar_speed import config

from tmem.train.cluster import start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", default=list(ROWS))
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--steps", type=int, default=120, help="timed steps per (row, size), over all rounds")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the default job, for every row")
    args = parser.parse_args()
    start(config(*args.overrides)[0])  # the devices train.py would train the default job on

    cfgs = {(row, size): config(f"mixer={row}", *args.overrides, f"train.microbatch={size}")[0]
            for row in args.rows for size in args.sizes}
    timed = time_steps(cfgs, args.steps, args.rounds)
    print(f"\n{'row':16s} {'default':>8s}" + "".join(f"{f'{s} ms':>10s}" for s in args.sizes) + f"{'fastest':>9s}")
    results = {}
    for row in args.rows:
        ms = {size: timed[(row, size)]["step_ms"] for size in args.sizes}
        fastest = min(ms, key=ms.get)
        default = config(f"mixer={row}", *args.overrides)[0].train.microbatch
        print(f"{row:16s} {str(default):>8s}" + "".join(f"{ms[s]:10.2f}" for s in args.sizes) + f"{fastest:9d}")
        results[row] = {"default": default, "step_ms": ms, "fastest": fastest}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
