"""Where a row's training step spends its time, by XLA operation, from JAX's own profiler.

    python benchmarks/profile_step.py mixer=mesa                 # the default job's step, by kind of operation
    python benchmarks/profile_step.py mixer=titans --top 30      # and its 30 costliest operations with their HLO

The step is train.py's (compiled once over the devices train.py would use),
run `--steps` times under `jax.profiler.trace`; the trace's events are summed
by operation. On a CPU each XLA thunk is an event: a fusion, a dot, a copy, a
loop. Times are summed over the devices' threads and divided by the steps, so
they add up to about the step time times the devices; the profiler's own
overhead stretches every operation, so read the shares, not the milliseconds.
An event can also hold a wait for the thread pool: time a surprising
operation alone before acting on it.
"""

from __future__ import annotations

import argparse
import collections
import glob
import re
import tempfile

import jax
from mqar_speed import compiled_step, config

from tmem.train.cluster import start

RUNTIME = ("$", "Thunk", "Pjit", "Await", "Parse", "Handle", "CommonPjRt", "Rendezvous", "Wait", "end:")  # not operations


def operation_times(compiled, state, steps: int) -> dict[str, float]:
    """Nanoseconds per step of each operation (by HLO name) in `steps` calls of the compiled step."""
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder):
            for _ in range(steps):
                state, _ = compiled(state)
            jax.block_until_ready(state)
        profile = jax.profiler.ProfileData.from_file(glob.glob(f"{folder}/**/*.xplane.pb", recursive=True)[0])
    times = collections.Counter()
    for plane in profile.planes:
        for line in plane.lines:
            for event in line.events:
                if not event.name.startswith(RUNTIME):
                    times[event.name] += event.duration_ns / steps
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--top", type=int, default=0, help="also list this many costliest operations")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the default job")
    args = parser.parse_args()
    cfg = config(*args.overrides)[0]
    start(cfg)
    compiled, state, _ = compiled_step(cfg)
    for _ in range(5):
        state, _ = compiled(state)
    times = operation_times(compiled, state, args.steps)
    kinds, counts = collections.Counter(), collections.Counter()
    for name, ns in times.items():
        kind = re.sub(r"\.\d+$", "", name)
        kinds[kind] += ns
        counts[kind] += 1
    total = sum(kinds.values())
    print(f"{' '.join(args.overrides) or 'default job'}: {total / 1e6:.1f} ms of operations a step over "
          f"{jax.device_count()} devices, {len(times)} operations")
    shown = kinds.most_common(20)
    for kind, ns in shown:
        print(f"{ns / 1e6:8.2f} ms {100 * ns / total:5.1f}%  {counts[kind]:4d} ops  {kind}")
    rest = kinds.most_common()[len(shown):]
    if rest:  # so that the listed shares add up to the whole
        ns = sum(n for _, n in rest)
        print(f"{ns / 1e6:8.2f} ms {100 * ns / total:5.1f}%  {sum(counts[k] for k, _ in rest):4d} ops  "
              f"({len(rest)} other kinds)")
    if args.top:
        hlo = compiled.as_text()
        for name, ns in times.most_common(args.top):
            found = re.search(rf"^\s*(?:ROOT )?%?{re.escape(name)} = (.{{0,160}})", hlo, re.MULTILINE)
            print(f"{ns / 1e6:8.2f} ms  {name}: {found.group(1) if found else ''}")


if __name__ == "__main__":
    main()
