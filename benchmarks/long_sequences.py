"""Peak memory and step time of one training step of every fixed-state row at long sequences.

    python benchmarks/long_sequences.py                      # every row at T = 512, 2048, 8192, batch 1
    python benchmarks/long_sequences.py --rows mesa gated_deltanet --lengths 2048 --batch 4
    python benchmarks/long_sequences.py --rows mesa mixer.run.form=parallel --lengths 512 2048

Each row trains the default MQAR job's model (width 64, two layers) with
`task.seq_len=T`, the least vocabulary MQAR allows at that length
(`task.vocab=T+2`) and `train.batch_size=B`, on one device, its whole batch at
once. Memory is XLA's own account of the compiled step
(`compiled.memory_analysis()`): the arguments (the train state and the
step's inputs), the temporaries at their peak, and the outputs not aliased
to the donated arguments. That is what the step needs on a device, and it is
the same on a loaded machine; the process's resident size would add the
compiler's and JAX's own. The time is the median of a few steps after a warm
one. Softmax attention is the reference: its state is not fixed (the cache
grows with T), nor is Hopfield's, which is not run. A cell that fails (out of
memory, say) is printed as such and the rest still run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import time

os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)

import jax  # noqa: E402
from mqar_speed import compiled_step, config  # noqa: E402

from tmem.train.cluster import start  # noqa: E402

ROWS = ("softmax", "linear", "retnet", "gla", "mamba2", "deltanet", "gated_deltanet", "mesa", "ttt_linear",
        "ttt_mlp", "titans")
LENGTHS = (512, 2048, 8192)
MESA_GOAL = 1.5  # mesa's peak at each length, at most this times Gated DeltaNet's (its chunked form)
MB = 2**20


def cell(row: str, T: int, batch: int, overrides, steps: int) -> dict:
    """One row at one length: the compiled step's memory in MiB, its time in ms, its compile time in s."""
    cfg = config(f"mixer={row}", f"task.seq_len={T}", f"task.vocab={T + 2}", f"train.batch_size={batch}",
                 "train.microbatch=null", *overrides)[0]
    compiled, state, compile_s = compiled_step(cfg)
    m = compiled.memory_analysis()
    out = {"row": row, "T": T, "batch": batch, "compile_s": round(compile_s, 1),
           "arguments_mb": m.argument_size_in_bytes / MB, "temp_mb": m.temp_size_in_bytes / MB,
           "peak_mb": (m.argument_size_in_bytes + m.temp_size_in_bytes + m.output_size_in_bytes
                       - m.alias_size_in_bytes) / MB}
    state, _ = compiled(state)  # warm: the first call allocates
    jax.block_until_ready(state)
    times = []
    for _ in range(steps):
        began = time.perf_counter()
        state, _ = compiled(state)
        jax.block_until_ready(state)
        times.append(1e3 * (time.perf_counter() - began))
    out["step_ms"] = statistics.median(times)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", default=list(ROWS))
    parser.add_argument("--lengths", nargs="+", default=list(LENGTHS))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per cell, after a warm one")
    parser.add_argument("--json", help="write the cells here as well")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every row, e.g. model.width=32")
    args = parser.parse_args()
    # `--rows` and `--lengths` take every word after them: overrides written there go back to the overrides
    args.overrides += [word for word in [*args.rows, *map(str, args.lengths)] if "=" in word]
    args.rows = [word for word in args.rows if "=" not in word]
    args.lengths = [int(word) for word in map(str, args.lengths) if "=" not in word]
    # one device, the batch whole: a benchmark of one example's memory may not be split
    start(config(f"mixer={args.rows[0]}", "cluster.cpu_devices=1", *args.overrides)[0])
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, jax {jax.__version__}, "
          f"{jax.device_count()} {jax.devices()[0].platform} device; batch {args.batch}; "
          f"overrides: {' '.join(args.overrides) or 'none'}", flush=True)
    print("\n| row | T | peak MiB | arguments MiB | temporaries MiB | step ms | compile s |\n"
          "|---|---:|---:|---:|---:|---:|---:|", flush=True)
    cells = []
    for T in args.lengths:
        for row in args.rows:
            try:
                c = cell(row, T, args.batch, args.overrides, args.steps)
            except Exception as e:  # noqa: BLE001  one failed cell (memory, say) is a result, not the end
                c = {"row": row, "T": T, "batch": args.batch, "error": f"{type(e).__name__}: {str(e)[:200]}"}
                print(f"| {row} | {T} | failed: {c['error']} |||||", flush=True)
            else:
                print(f"| {row} | {T} | {c['peak_mb']:.1f} | {c['arguments_mb']:.1f} | {c['temp_mb']:.1f} | "
                      f"{c['step_ms']:.0f} | {c['compile_s']:.1f} |", flush=True)
            cells.append(c)
            gc.collect()
    peak = {(c["row"], c["T"]): c.get("peak_mb") for c in cells}
    for T in args.lengths:
        mesa, gdn = peak.get(("mesa", T)), peak.get(("gated_deltanet", T))
        if mesa and gdn:
            ratio = mesa / gdn
            print(f"T {T}: mesa's peak {ratio:.2f} x Gated DeltaNet's (goal {MESA_GOAL}"
                  f"{'' if ratio <= MESA_GOAL else ', not met'})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(cells, f, indent=1)


if __name__ == "__main__":
    main()
