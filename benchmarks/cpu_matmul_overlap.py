"""Why the chunked form runs far below the CPU's matmul rate: overlapping matmuls and fresh memory.

    python benchmarks/cpu_matmul_overlap.py

The chunked form (tmem.memory.chunked) is a dozen batched 64 x 64 matmuls over
[chunks, batch, heads] and as many elementwise passes, each over 16 MB at
T = 4096. Measured alone, one such matmul runs near the CPU's matmul rate. In
the program, XLA's CPU runtime starts every operation whose inputs are ready,
so two independent matmuls (a backward pass is full of them: each matmul's
two gradients) run at once, each asking for every core. This prints, in one
process, one matmul, two independent ones, and the same two ordered by an
optimization barrier; and the page faults a call of the chunked form takes,
since XLA maps its temporary buffers afresh on every call.
"""

from __future__ import annotations

import os
import resource
import time

os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from tmem.memory import chunked  # noqa: E402


def best_ms(f, *xs, repeats: int = 10) -> float:
    f = jax.jit(f)
    jax.block_until_ready(f(*xs))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(f(*xs))
        best = min(best, time.perf_counter() - start)
    return 1e3 * best


def matmul(a, b):
    return jnp.einsum("...ij,...jk->...ik", a, b)


def ordered(a, b):
    first = matmul(a, b)
    b, first = jax.lax.optimization_barrier((b, first))  # the second waits for the first
    return first, matmul(b, a)


def faults_per_call(f, x, calls: int = 3) -> float:
    f = jax.jit(f)
    jax.block_until_ready(f(x))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        jax.block_until_ready(f(x))
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls


def main():
    shape = (64, 4, 4, 64, 64)  # [chunks, batch, heads, 64, 64]: T = 4096 in chunks of 64
    a, b = (jax.random.normal(jax.random.key(i), shape) for i in range(2))
    one = best_ms(matmul, a, b)
    both = best_ms(lambda a, b: (matmul(a, b), matmul(b, a)), a, b)
    in_turn = best_ms(ordered, a, b)
    gflop = 2 * a.size * shape[-1] / 1e9
    print(f"{os.cpu_count()} cores, jax {jax.__version__}; batched matmuls {shape}, {gflop:.2f} GFLOP each")
    print(f"  one matmul                         {one:6.2f} ms  ({gflop / one * 1e3:.0f} GFLOP/s)")
    print(f"  two independent matmuls            {both:6.2f} ms  ({both / one:.1f}x one)")
    print(f"  the same two, ordered by a barrier {in_turn:6.2f} ms  ({in_turn / one:.1f}x one)")

    q, k, v = (jax.random.normal(jax.random.key(i), (4, 4096, 4, 64)) for i in range(3))

    def loss(x):
        o, _ = chunked(*x)
        return jnp.sum(o * jnp.cos(o))

    grad = jax.grad(loss)
    temp = jax.jit(grad).lower((q, k, v)).compile().memory_analysis().temp_size_in_bytes
    print(f"linear row, chunked forward + backward at T = 4096: {best_ms(grad, (q, k, v), repeats=3):.0f} ms, "
          f"{temp / 2**20:.0f} MB temporaries, {faults_per_call(grad, (q, k, v)):.0f} page faults a call "
          f"({temp / 4096:.0f} pages of 4 KB)")


if __name__ == "__main__":
    main()
