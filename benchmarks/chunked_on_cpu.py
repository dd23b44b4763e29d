"""Why the chunked form runs far below the CPU's matmul rate: what each kind of operation costs.

    python benchmarks/chunked_on_cpu.py

The chunked form (tmem.memory.chunked) is a dozen batched 64 x 64 matmuls over
[chunks, batch, heads] and as many elementwise passes, each over 16 MB at
T = 4096. This prints, in one process, what those operations cost alone on
this machine, and then the linear row's whole forward and backward:

* a batched matmul whose left operand is contracted over its rows (k^T u, the
  form of every state write and of half the gradients) against the plain form:
  XLA hands only the plain form to its fast small-matmul library (YNNPACK);
* two independent matmuls, as a backward pass is full of, against the same two
  ordered by an optimization barrier: XLA's CPU runtime starts every operation
  whose inputs are ready, and two at once compete for the cores;
* one elementwise pass over a tensor that fits the cache and over one that
  does not, each into a freshly mapped output as in the program: the
  program's temporaries (130 MB) do not fit, so its passes run at the speed
  of main memory and of the page faults;
* sines and cosines over the output, what a nonlinear test loss adds to any form;
* the page faults a call takes: XLA maps its temporaries afresh on every call.
"""

from __future__ import annotations

import os
import resource

os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from fast_weight_speed import best_ms, inputs, program  # noqa: E402


def matmul(a, b):
    return jnp.einsum("...ij,...jk->...ik", a, b)


def matmul_rows(a, b):  # a^T b, both contracted over their rows
    return jnp.einsum("...ji,...jk->...ik", a, b)


def ordered(a, b):
    first = matmul(a, b)
    b, first = jax.lax.optimization_barrier((b, first))  # the second waits for the first
    return first, matmul(b, a)


def faults_per_call(f, *xs, calls: int = 3) -> float:
    jax.block_until_ready(f(*xs))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        jax.block_until_ready(f(*xs))
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls


def main():
    shape = (64, 4, 4, 64, 64)  # [chunks, batch, heads, 64, 64]: T = 4096 in chunks of 64
    a, b = (jax.random.normal(jax.random.key(i), shape) for i in range(2))
    one, rows, both, in_turn = (best_ms(jax.jit(f), a, b, repeats=10) for f in (
        matmul, matmul_rows, lambda a, b: (matmul(a, b), matmul(b, a)), ordered))
    gflop = 2 * a.size * shape[-1] / 1e9
    print(f"{os.cpu_count()} cores, jax {jax.__version__}; batched matmuls {shape}, {gflop:.2f} GFLOP each")
    print(f"  one matmul, a b                      {one:6.2f} ms  ({gflop / one * 1e3:.0f} GFLOP/s)")
    print(f"  one matmul, a^T b                    {rows:6.2f} ms  ({rows / one:.1f}x a b)")
    print(f"  two independent matmuls              {both:6.2f} ms  ({both / one:.1f}x one)")
    print(f"  the same two, ordered by a barrier   {in_turn:6.2f} ms  ({in_turn / one:.1f}x one)")

    for mb in (16, 64):
        x = jax.random.normal(jax.random.key(2), (mb * 2**18,))
        ms = best_ms(jax.jit(lambda x: 1.5 * x + 1.0), x, repeats=10)
        print(f"  one elementwise pass over {mb:2d} MB      {ms:6.2f} ms  ({2 * mb / ms:.0f} GB/s read + written)")
    o = 30 * a  # outputs of the size and spread of the benchmark's
    loss_grad = jax.jit(jax.grad(lambda o: jnp.sum(o * jnp.cos(o))))
    print(f"  sum(o cos o) and its gradient, 16 MB {best_ms(loss_grad, o, repeats=10):6.2f} ms")

    x = inputs("linear", 4, 4096, 4, 64)
    do = jax.random.normal(jax.random.key(1), x["v"].shape)
    f = program("chunked", "linear", 64, 8)
    temp = f.lower(x, do).compile().memory_analysis().temp_size_in_bytes
    print(f"linear row, chunked forward + backward at T = 4096: {best_ms(f, x, do):.0f} ms, "
          f"{temp / 2**20:.0f} MB temporaries, {faults_per_call(f, x, do):.0f} page faults a call "
          f"({temp / 4096:.0f} pages of 4 KB)")


if __name__ == "__main__":
    main()
