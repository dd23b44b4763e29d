"""The unified table on an accelerator: matmul ceiling, each row's step time and utilisation, bf16 against f32.

    python benchmarks/gpu.py --out results/          # what benchmarks/gpu.sh runs on a lent GPU
    python benchmarks/gpu.py --tiny --out /tmp/x     # a CPU smoke: the same code at a tiny size

In order, each part saved as it ends, so a run cut short by its time limit
keeps what it measured: the matmul ceiling in float32 (TF32 where the GPU
has it) and bfloat16; every row of the table on the default MQAR job
(softmax attention with its plain and its fused read), step time (median of
rounds taken in turns, so a passing load falls on every row alike) and
model-FLOP utilisation (tmem.flops' analytic count over the ceiling of the
step's compute dtype; "-" where a form has no count); every row on a
100M-class model at T = 1024 in float32 and then bfloat16, row by row;
chunked Gated DeltaNet at T = 4096 and 16,384; then the default job's time
to 0.99 held-out accuracy for each row, seed 0, compile included.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import jax  # noqa: E402
from mqar_rows import time_steps  # noqa: E402
from mqar_speed import config, matmul_rate, time_to_target  # noqa: E402

from tmem.flops import step_flops  # noqa: E402
from tmem.mixers.flops import Uncounted  # noqa: E402

# every row that reads a token task (lsa reads vectors, none is no mixer); softmax also with its fused read
TABLE = ("softmax", "linear", "retnet", "gla", "mamba2", "deltanet", "gated_deltanet", "mesa", "ttt_linear", "ttt_mlp",
         "titans", "hopfield")
# every job differentiates each device's whole share at once (the rows' recipes split it in slices of 8, the CPU's
# fastest, which would starve a GPU)
WHOLE = "train.microbatch=null"
ROWS = {"softmax": ["mixer=softmax", "mixer.run.implementation=plain", WHOLE],
        "softmax_fused": ["mixer=softmax", "mixer.run.implementation=fused", WHOLE],
        **{row: [f"mixer={row}", WHOLE] for row in TABLE[1:]}}
# step time and utilisation only (no run to a target): a 100M-class model at T = 1024, in float32 and bfloat16
# (softmax with its fused read), and chunked Gated DeltaNet at long sequences (4 heads of 128, fla's chunk of 64)
BIG = ["task.seq_len=1024", "task.vocab=8192", "task.num_kv_pairs=64", "model.width=768", "model.depth=12",
       "mixer.heads=12", "mlp=swiglu", "mlp.expansion=2.67", "train.batch_size=8", WHOLE]
LONG = ["task.vocab=32768", "task.num_kv_pairs=64", "model.width=512", "model.depth=2", "mixer.heads=4",
        "train.batch_size=2", WHOLE]
SCALE = {f"{row}_100m{suffix}": [*ROWS["softmax_fused" if row == "softmax" else row], *BIG, *dtype]
         for row in TABLE for suffix, dtype in (("", []), ("_bf16", ["train.compute_dtype=bfloat16"]))}
SCALE |= {f"gated_deltanet_{T}": ["mixer=gated_deltanet", *LONG, f"task.seq_len={T}"] for T in (4096, 16384)}
TINY_SCALE = ["task.vocab=64", "task.seq_len=32", "task.num_kv_pairs=2", "model.width=16", "model.depth=1",
              "mixer.heads=2", "mlp.expansion=2", "train.batch_size=2"]
TINY = ["task.vocab=32", "task.seq_len=16", "task.num_kv_pairs=2", "task.heldout_size=64", "model.width=16",
        "mixer.heads=2", "train.batch_size=16", "train.microbatch=8", "train.steps=6", "train.eval_every=3",
        "train.log_every=3", "train.checkpoint_every=6", "train.target=0.0"]


def matmul_ceiling(n: int, dtype: str = "float32") -> float:
    """FLOP/s of a large matmul (float32 is TF32 where the GPU allows it): the rate utilisation is counted against,
    each row against the ceiling of its compute dtype."""
    return matmul_rate(n, reps=10, dtype=dtype)


def table(results: dict) -> str:
    lines = [f"device: {results['device']}, jax {results['jax']}; matmul ceiling "
             f"{results['matmul_tflops']:.1f} TFLOP/s (float32), {results['matmul_tflops_bf16']:.1f} (bfloat16)", "",
             "| row | step ms | MFU | compile s | 0.99 at step | time to 0.99 s |", "|---|---|---|---|---|---|"]
    for name, r in results["rows"].items():
        reached, mfu = (r.get("target_step"), r.get("target_seconds")), r["mfu"]
        lines.append(f"| {name} | {r['step_ms']:.2f} | {'-' if mfu is None else f'{mfu:.1%}'} | {r['compile_s']:.1f} | "
                     f"{reached[0] if reached[0] is not None else '-'} | "
                     f"{reached[1] if reached[1] is not None else '-'} |")
    lines += [f"| {name} | failed: {why} |||||" for name, why in results.get("failed", {}).items()]
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for results.json and table.md")
    parser.add_argument("--tiny", action="store_true", help="a tiny job and few steps: a smoke test on a CPU")
    parser.add_argument("--rows", nargs="+", default=[*ROWS, *SCALE], choices=[*ROWS, *SCALE])
    parser.add_argument("--skip-train", action="store_true", help="step times only, no time to 0.99")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    extra = TINY if args.tiny else []
    device = jax.devices()[0]
    n = 256 if args.tiny else 8192
    results = {"device": f"{jax.device_count()} x {device.device_kind} ({device.platform})", "jax": jax.__version__,
               "matmul_tflops": matmul_ceiling(n) / 1e12, "matmul_tflops_bf16": matmul_ceiling(n, "bfloat16") / 1e12,
               "rows": {}, "failed": {}}

    def save():
        (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        (args.out / "table.md").write_text(table(results) + "\n")

    def measure(overrides: dict[str, list[str]], steps: int):
        cfgs = {name: config(*o, *extra)[0] for name, o in overrides.items()}
        rounds = 2 if args.tiny else 3
        timed = time_steps(cfgs, steps=rounds * (3 if args.tiny else steps), rounds=rounds)
        for name, cfg in cfgs.items():
            try:
                flops = step_flops(cfg)["total"]
            except Uncounted:  # timed all the same
                flops = None
            ms = timed[name]["step_ms"]
            ceiling = results["matmul_tflops_bf16" if cfg.train.compute_dtype == "bfloat16" else "matmul_tflops"]
            mfu = None if flops is None else flops / (ms / 1e3) / (ceiling * 1e12)
            results["rows"][name] = {**timed[name], "flops": flops, "mfu": mfu}
        save()

    job = {name: ROWS[name] for name in args.rows if name in ROWS}
    measure(job, steps=100)
    scale = [name for name in args.rows if name in SCALE]
    if scale:  # one at a time: each is large, and these are timed alone
        extra = TINY_SCALE if args.tiny else []
        for name in scale:
            try:
                measure({name: SCALE[name]}, steps=10)
            except Exception as e:  # noqa: BLE001  a model too large for the device is a result; the rest still run
                results["failed"][name] = f"{type(e).__name__}: {str(e)[:300]}"
                save()
        extra = TINY if args.tiny else []
    if not args.skip_train:
        for name in job:
            cfg, resolved = config(*ROWS[name], *extra)
            results["rows"][name].update(time_to_target(cfg, resolved))
            save()  # a run cut short keeps the rows done
    print(table(results))
    return results


if __name__ == "__main__":
    main()
