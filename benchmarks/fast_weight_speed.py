"""Speed and memory of the fast-weight memories: chunked form, token scan, and softmax attention.

    python benchmarks/fast_weight_speed.py                       # every row, T = 512 .. 8192
    python benchmarks/fast_weight_speed.py --rows deltanet --lengths 1024 4096
    python benchmarks/fast_weight_speed.py --rows mesa ttt_linear ttt_mlp titans   # the test-time-regression rows

The test-time-regression rows' "chunked" form is their training form (mesa's
parallel solve by 30 conjugate-gradient steps, TTT-Linear's dual form, the
gradient memory's scan over mini-batches of 16 with TTT-MLP's and Titans'
settings) and "recurrent" their token loop; their slow weights (mesa's
Lambda, the initial inner models, TTT's LayerNorm) are differentiated too.

Forward + backward of the memory alone (tmem.memory: `chunked`, `recurrent`,
`softmax_read` with a causal mask), at batch 4, 4 heads, d_k = d_v = 64, float32;
the projections around it are the same for every row and left out. Time is the
best of a few repeats (the machine may be shared); memory is the compiled
program's temporary buffers from XLA's memory analysis. Softmax is timed only
while its temporaries stay under --softmax-limit-gb; beyond that only its
memory is reported. All numbers come from one process, so ratios hold.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from tmem.memory import chunked, gradient, mesa, recurrent, softmax_read, ttt  # noqa: E402
from tmem.memory.linear_state import retnet_log_decay  # noqa: E402

ROWS = {  # the memory's inputs for each row: (decay kind, write strength given, delta rule)
    "linear": ("none", False, False),
    "retnet": ("fixed", False, False),
    "gla": ("vector", False, False),
    "mamba2": ("scalar", True, False),
    "deltanet": ("none", True, True),
    "gated_deltanet": ("scalar", True, True),
}


MINI_BATCH = 16  # TTT's and Titans' official mini-batch
# the test-time-regression rows: the gradient memory's inner model and optimiser, or None for their own modules
REGRESSION = {"mesa": None, "ttt_linear": None,
              "ttt_mlp": (gradient.Inner("mlp", bias=True, norm=True), False),
              "titans": (gradient.Inner("mlp", bias=True, norm=True), True)}  # (inner model, momentum and forgetting)


def regression_inputs(row: str, x: dict, ks) -> dict:
    """The gates, rates and slow weights a test-time-regression row's memory reads, beside q, k, v."""
    B, T, H, d = x["q"].shape
    gate = jax.nn.sigmoid(jax.random.normal(ks[3], (B, T, H)))
    x["k"] = x["k"] / jnp.linalg.norm(x["k"], axis=-1, keepdims=True)
    if row == "mesa":
        x["q"] = x["q"] / jnp.linalg.norm(x["q"], axis=-1, keepdims=True)
        return {**x, "log_a": jnp.log(gate), "beta": gate, "lam": jnp.ones((H, d))}
    ln = (jnp.ones((H, d)), jnp.zeros((H, d)))
    tok = 1 / jnp.arange(1, MINI_BATCH + 1)
    if row == "ttt_linear":
        W0 = 0.02 * jax.random.normal(ks[5], (H, d, d))
        return {**x, "lr": gate / d, "token_lr": tok, "ln": ln, "W0": W0}
    inner, titans = REGRESSION[row]
    params = gradient.init_params(inner, H, d, 4 * d, ks[5], 0.02)
    out = {**x, "theta": gate / d, "ln": ln, "params": params}
    if titans:
        out.update(log_a=jnp.log1p(-gate / 100), log_eta=jnp.log(gate))
    else:
        out["tok"] = tok
    return out


def regression_memory(form: str, row: str, x: dict):
    """The row's memory read-out from an empty state (its initial weights for the gradient rows)."""
    B, _, H, d = x["q"].shape
    if row == "mesa":
        if form == "chunked":
            return mesa.parallel(**x)[0]
        return mesa.recurrent(**x)[0]
    x = dict(x)
    if row == "ttt_linear":
        W0 = x.pop("W0")
        scale, bias = x.pop("ln")
        state = (jnp.broadcast_to(W0[None], (B, H, d, d)), jnp.zeros((B, H, d)), jnp.zeros((B, H, d, d)),
                 jnp.zeros((B, H, d)))
        form_fn = ttt.dual if form == "chunked" else ttt.recurrent
        return form_fn(**x, ln_scale=scale, ln_bias=bias, state=state, mini_batch=MINI_BATCH)[0]
    inner, titans = REGRESSION[row]
    state = gradient.initial_state(x.pop("params"), B, momentum=titans)
    form_fn = gradient.parallel if form == "chunked" else gradient.recurrent
    return form_fn(**x, inner=inner, state=state, mini_batch=MINI_BATCH)[0]


def inputs(row: str | None, B: int, T: int, H: int, d: int) -> dict:
    ks = jax.random.split(jax.random.key(0), 6)
    x = {"q": jax.random.normal(ks[0], (B, T, H, d)), "k": jax.random.normal(ks[1], (B, T, H, d)),
         "v": jax.random.normal(ks[2], (B, T, H, d))}
    if row is None:
        return x
    if row in REGRESSION:
        return regression_inputs(row, x, ks)
    decay, strength, delta = ROWS[row]
    if delta:
        x["k"] = x["k"] / jnp.linalg.norm(x["k"], axis=-1, keepdims=True)
    if decay in ("scalar", "vector"):
        width = 1 if decay == "scalar" else d
        x["log_a"] = jax.nn.log_sigmoid(jax.random.normal(ks[3], (B, T, H, width))) / 16
    if strength:
        x["beta"] = jax.nn.sigmoid(jax.random.normal(ks[4], (B, T, H)))
    return x


def program(form: str, row: str | None, chunk: int, sub_chunk: int):
    """(inputs, do) -> the memory's vector-Jacobian product: the gradients of sum(o * do) for every input.

    The cotangent do is an input, random like the rest, so XLA cannot simplify the backward pass,
    and nothing but the memory is timed: a nonlinear loss such as sum(o cos o) would add about
    20 ms of sines and cosines at T = 4096 to both forms alike (benchmarks/chunked_on_cpu.py).
    """
    delta = row in ROWS and ROWS[row][2]

    def memory(x):
        if row in REGRESSION:
            return regression_memory(form, row, x)
        if row is not None and ROWS[row][0] == "fixed":  # a constant of the model, as in the mixer: not differentiated
            B, T, H, _ = x["q"].shape
            x = {**x, "log_a": jnp.broadcast_to(retnet_log_decay(H)[:, None], (B, T, H, 1))}
        if form == "softmax":
            T, d = x["q"].shape[1], x["q"].shape[-1]
            mask = jnp.tril(jnp.ones((T, T), bool))[None, None]
            return softmax_read(x["q"], x["k"], x["v"], mask, d**-0.5)[0]
        if form == "chunked":
            return chunked(**x, delta=delta, chunk=chunk, sub_chunk=sub_chunk)[0]
        return recurrent(**x, delta=delta)[0]

    def forward_backward(x, do):
        _, pullback = jax.vjp(memory, x)
        return pullback(do)[0]

    return jax.jit(forward_backward)


def best_ms(f, *xs, repeats: int = 3) -> float:
    """The best of `repeats` timed calls of a compiled f(*xs), in ms, after one call to warm it."""
    jax.block_until_ready(f(*xs))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(f(*xs))
        best = min(best, time.perf_counter() - start)
    return 1e3 * best


def measure(form, row, T, args) -> dict:
    x = inputs(None if form == "softmax" else row, args.batch, T, args.heads, args.d)
    do = jax.random.normal(jax.random.key(1), x["v"].shape)
    start = time.perf_counter()
    compiled = program(form, row, args.chunk, args.sub_chunk).lower(x, do).compile()
    compile_s = time.perf_counter() - start
    temp = compiled.memory_analysis().temp_size_in_bytes
    result = {"form": form, "row": row, "T": T, "compile_s": compile_s, "temp_mb": temp / 2**20, "ms": None}
    if form == "softmax" and temp > args.softmax_limit_gb * 2**30:
        return result
    result["ms"] = best_ms(compiled, x, do, repeats=args.repeats)
    return result


def fmt(r):
    return "-" if r is None or r["ms"] is None else f"{r['ms']:.0f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=[*ROWS, *REGRESSION])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--forms", nargs="+", default=["chunked", "recurrent"], choices=["chunked", "recurrent"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--d", type=int, default=64, help="d_k = d_v per head")
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--sub-chunk", type=int, default=8, help="blocks of a vector decay (GLA)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--softmax-limit-gb", type=float, default=4.0)
    parser.add_argument("--json", help="also write every measurement to this file")
    args = parser.parse_args()

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, jax {jax.__version__}, "
          f"{jax.devices()[0].platform}; B={args.batch} H={args.heads} d_k=d_v={args.d} chunk={args.chunk} "
          f"sub_chunk={args.sub_chunk}",
          flush=True)
    results = []
    for T in args.lengths:
        r = measure("softmax", None, T, args)
        results.append(r)
        print(f"softmax          T={T:5d}  {fmt(r):>7} ms  {r['temp_mb']:9.1f} MB temp", flush=True)
    for row in args.rows:
        for form in args.forms:
            for T in args.lengths:
                r = measure(form, row, T, args)
                results.append(r)
                print(f"{row:14s} {form:9s} T={T:5d}  {fmt(r):>7} ms  {r['temp_mb']:9.1f} MB temp  "
                      f"(compile {r['compile_s']:.1f} s)", flush=True)

    def get(form, row, T):
        return next((r for r in results if (r["form"], r["row"], r["T"]) == (form, row, T)), None)

    print("\n| row | form | " + " | ".join(f"T={T}" for T in args.lengths) + " |")
    print("|---|---|" + "---|" * len(args.lengths))
    for row in [None, *args.rows]:
        for form in (["softmax"] if row is None else args.forms):
            cells = [f"{fmt(get(form, row, T))} ms / {get(form, row, T)['temp_mb']:.0f} MB" for T in args.lengths]
            print(f"| {row or 'softmax'} | {form} | " + " | ".join(cells) + " |")
    if 4096 in args.lengths and 8192 in args.lengths:
        print("\nratios at T = 4096 (scan / chunked) and growth 8192 / 4096 (chunked):")
        for row in args.rows:
            c4, c8, r4 = get("chunked", row, 4096), get("chunked", row, 8192), get("recurrent", row, 4096)
            speedup = r4["ms"] / c4["ms"] if r4 and r4["ms"] else None
            print(f"  {row:14s} scan/chunked {speedup and f'{speedup:.1f}x'}  chunked 8192/4096 "
                  f"{c8['ms'] / c4['ms']:.2f}")
    if 2048 in args.lengths and 4096 in args.lengths:
        s2, s4 = get("softmax", None, 2048), get("softmax", None, 4096)
        if s2["ms"] and s4["ms"]:
            print(f"  softmax 4096/2048 {s4['ms'] / s2['ms']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
