"""Speed of the default MQAR job: throughput, FLOP floor, compile time, time to 99%.

    python benchmarks/mqar_speed.py                 # everything, seeds 0 1 2
    python benchmarks/mqar_speed.py --seeds 0 --skip-train   # throughput only

All numbers come from one process, so their ratios hold on a shared, noisy
machine. The persistent compilation cache is off: compile time counts.

The step runs on the devices train.py would train on (`cluster.cpu_devices`:
one by default; `cluster.cpu_devices=auto`, one per core). Its FLOPs are
tmem.flops' analytic count, or "not counted" for the forms it refuses. XLA's
cost analysis, printed beside it, counts one device's share and the body of a
loop once: one of the step's microbatches (lax.map), one chunk of a scan.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import tempfile
import time
from contextlib import redirect_stderr

os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)

import jax  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from tmem.config import CONFIG_DIR, validate  # noqa: E402
from tmem.flops import step_flops  # noqa: E402
from tmem.mixers.flops import Uncounted  # noqa: E402
from tmem.train.build import build  # noqa: E402
from tmem.train.cluster import start  # noqa: E402
from tmem.train.loop import data_parallel_step, run  # noqa: E402
from tmem.train.mesh import data_mesh, replicated  # noqa: E402


def config(*overrides):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        # no persistent compilation cache: each run's compile counts, as a sweep's first run's does
        cfg = compose("train", overrides=["logger=disabled", "cluster.compilation_cache=null", *overrides])
    return validate(cfg), OmegaConf.to_container(cfg, resolve=True)


def matmul_rate(n: int = 1024, reps: int = 20, dtype: str = "float32") -> float:
    """FLOP/s of a large matmul (float32 unless told): what the device does at best."""
    a = jax.random.normal(jax.random.key(0), (n, n)).astype(dtype)
    f = jax.jit(lambda a: a @ a)
    f(a).block_until_ready()
    start = time.perf_counter()
    for _ in range(reps):
        out = f(a)
    out.block_until_ready()
    return 2 * n**3 * reps / (time.perf_counter() - start)


def compiled_step(cfg):
    """The train step train.py runs (tmem.train.loop's, over every device), compiled, its state, and the compile
    time. Call `start` first, as train.py does, for train.py's devices."""
    mesh = data_mesh()
    graphdef, state, tx, schedule = build(cfg)
    step = data_parallel_step(cfg, graphdef, tx, schedule, mesh)
    began = time.perf_counter()
    compiled = step.lower(state).compile()
    return compiled, jax.device_put(state, replicated(mesh)), time.perf_counter() - began


def step_throughput(cfg, steps: int = 300) -> dict:
    task, t = cfg.task, cfg.train
    try:  # an option the count does not cover is said so, and the step is still timed
        parts = step_flops(cfg)
    except Uncounted as e:
        print(f"step FLOPs not counted: {e}")
        parts = None
    compiled, state, compile_s = compiled_step(cfg)
    cost = compiled.cost_analysis()
    xla_flops = (cost[0] if isinstance(cost, list) else cost)["flops"]  # loop bodies counted once
    for _ in range(20):
        state, metrics = compiled(state)
    jax.block_until_ready(state)
    start = time.perf_counter()
    for _ in range(steps):
        state, metrics = compiled(state)
    jax.block_until_ready(state)
    step_s = (time.perf_counter() - start) / steps
    flops = None if parts is None else parts.pop("total")
    return {"compile_s": compile_s, "step_ms": 1e3 * step_s, "flops": flops, "xla_flops": xla_flops,
            "flops_by_part": parts, "tokens_per_s": t.batch_size * task.seq_len / step_s, "steps_per_s": 1 / step_s}


def time_to_target(cfg, resolved) -> dict:
    with tempfile.TemporaryDirectory() as d, redirect_stderr(io.StringIO()):
        s = run(cfg, d, resolved)
    return {k: s[k] for k in ("target_step", "target_seconds", "eval/accuracy", "steps", "wall_seconds")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--skip-train", action="store_true", help="only throughput and the FLOP floor")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the default job")
    args = parser.parse_args()

    cfg, resolved = config(*args.overrides)
    start(cfg)  # the devices train.py would train on
    rate = matmul_rate()
    speed = step_throughput(cfg)
    rate_after = matmul_rate()  # bracket the step timing: the machine is shared
    rate = max(rate, rate_after)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, jax {jax.__version__}, "
          f"{jax.device_count()} {jax.devices()[0].platform} devices")
    print(f"job: {' '.join(args.overrides) or 'default'}  (batch {cfg.train.batch_size}, T {cfg.task.seq_len})")
    print(f"matmul rate            {rate / 1e9:8.1f} GFLOP/s (1024^3 float32, one device)")
    floor_ms = None
    if speed["flops"] is not None:
        floor_ms = 1e3 * speed["flops"] / rate
        print(f"step FLOPs             {speed['flops'] / 1e9:8.3f} GFLOP (tmem.flops: forward, backward, AdamW)")
        print("  by part              " + ", ".join(f"{name} {flops / speed['flops']:.1%}" for name, flops in
                                                   sorted(speed["flops_by_part"].items(), key=lambda kv: -kv[1])))
    print(f"  XLA's cost analysis  {speed['xla_flops'] / 1e9:8.3f} GFLOP (one device's share, a loop's body counted "
          "once: one microbatch, one chunk's state pass)")
    if floor_ms is not None:
        print(f"step FLOP floor        {floor_ms:8.2f} ms")
    print(f"step time              {speed['step_ms']:8.2f} ms" +
          ("" if floor_ms is None else f"  ({speed['step_ms'] / floor_ms:.2f} x floor)"))
    print(f"throughput             {speed['steps_per_s']:8.1f} steps/s, {speed['tokens_per_s']:,.0f} tokens/s")
    print(f"compile                {speed['compile_s']:8.2f} s")
    results = {"matmul_gflops": rate / 1e9, **speed, "floor_ms": floor_ms, "devices": jax.device_count()}
    if not args.skip_train:
        runs = []
        for seed in args.seeds:
            cfg_s, resolved_s = config(*args.overrides, f"train.seed={seed}")
            r = time_to_target(cfg_s, resolved_s)
            runs.append(r)
            print(f"seed {seed}: eval/accuracy >= 0.99 at step {r['target_step']} after {r['target_seconds']} s "
                  f"(final {r['eval/accuracy']:.4f} at step {r['steps']})")
        reached = [r["target_seconds"] for r in runs]
        if None not in reached:
            print(f"time to 99%            {statistics.median(reached):8.1f} s median over seeds {args.seeds}")
        else:
            print(f"time to 99%            not reached for every seed: {reached}")
        results["runs"] = runs
    print(json.dumps(results))


if __name__ == "__main__":
    main()
