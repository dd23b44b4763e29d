"""Each row's held-out evaluation at several chunk sizes, in one process: the data behind make_eval's CPU_EVAL_CHUNK.

    python benchmarks/eval_chunk.py                                   # every row of mqar_rows, chunks 8, 16, 50
    python benchmarks/eval_chunk.py --rows softmax gla --chunks 4 8 16
    python benchmarks/eval_chunk.py --rows deltanet --chunks 8 --forms chunked recurrent mixer.heads=4

A chunk is the held-out examples each device evaluates in one pass; it changes
only how the sums are taken (tests/test_train.py), not the metrics. Each row
evaluates as training does: in its evaluation form unless `--forms` names
forms to compare, on the default job's 3,000 held-out examples over
train.py's devices. Every (row, form, chunk) is compiled first and then timed
in turns, so a load that comes and goes falls on all of them alike; the
compile time is printed too, since the first evaluation of every run pays it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
from mqar_rows import ROWS
from mqar_speed import config

from tasks import heldout
from tmem.train.build import build, evaluation_graphdef
from tmem.train.cluster import start
from tmem.train.mesh import data_mesh, replicated
from tmem.train.step import make_eval


def compiled_eval(cfg, chunk: int, mesh):
    """The evaluation train.py runs for `cfg` at `chunk` examples a device, compiled; its arguments; compile s."""
    whole = replicated(mesh)
    built = build(cfg)
    params, rest = jax.device_put((built.state.params, built.state.rest), whole)
    graphdef = evaluation_graphdef(built.graphdef, params, rest)
    evaluate = jax.jit(make_eval(graphdef, cfg.task, chunk, mesh=mesh, compute_dtype=cfg.train.compute_dtype),
                       out_shardings=whole)
    args = (params, rest, jax.jit(lambda: heldout(cfg.task), out_shardings=whole)())
    began = time.perf_counter()
    compiled = evaluate.lower(*args).compile()
    return compiled, args, time.perf_counter() - began


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", default=list(ROWS))
    parser.add_argument("--chunks", type=int, nargs="+", default=[8, 16, 50])
    parser.add_argument("--forms", nargs="+", default=[None], help="mixer.run.eval_form values (default: each row's)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the default job, for every row")
    args = parser.parse_args()
    start(config(*args.overrides)[0])  # the devices train.py would train the default job on
    mesh = data_mesh()

    # a row, or a row in one evaluation form ("deltanet recurrent"), is a line of the table
    lines = {" ".join(filter(None, (row, form))): [f"mixer={row}", *args.overrides] + (
        [f"mixer.run.eval_form={form}"] if form else []) for row in args.rows for form in args.forms}
    programs = {}
    for line, overrides in lines.items():
        cfg = config(*overrides)[0]
        for chunk in args.chunks:
            compiled, inputs, compile_s = compiled_eval(cfg, chunk, mesh)
            jax.block_until_ready(compiled(*inputs))  # warm: the first call allocates
            programs[(line, chunk)] = (compiled, inputs, compile_s, [])
    for _ in range(args.rounds):
        for compiled, inputs, _, times in programs.values():
            began = time.perf_counter()
            jax.block_until_ready(compiled(*inputs))
            times.append(1e3 * (time.perf_counter() - began))

    print(f"\n{'row':26s}" + "".join(f"{f'{c} ms':>10s}" for c in args.chunks) + f"{'fastest':>9s}"
          + "".join(f"{f'compile {c}':>12s}" for c in args.chunks))
    results = {}
    for line in lines:
        ms = {c: statistics.median(programs[(line, c)][3]) for c in args.chunks}
        compile_s = {c: programs[(line, c)][2] for c in args.chunks}
        fastest = min(ms, key=ms.get)
        print(f"{line:26s}" + "".join(f"{ms[c]:10.1f}" for c in args.chunks) + f"{fastest:9d}"
              + "".join(f"{compile_s[c]:11.2f}s" for c in args.chunks))
        results[line] = {"eval_ms": ms, "compile_s": compile_s, "fastest": fastest}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
