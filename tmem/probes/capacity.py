"""The capacity table: how many random key-value pairs each store holds (no trained model).

    python eval.py 'probes=[capacity]'
    python eval.py 'probes=[capacity]' options.capacity.d_k=32 'options.capacity.betas=[1,2,3]'

For each store the interference-to-signal ratio is measured against the number
of stored pairs M (random unit keys and values, querying with stored keys),
and the capacity is the M where it crosses one, found by a search on M.
Each entry reports the measured `capacity`, the exact-moment `theory` for unit
vectors and the note's `formula`. The polynomial stores run at d_k (64 by
default); the exponential read, whose capacity at d_k = 64 and beta = 8 is
about a million, runs at softmax_d_k (16), at beta = sqrt(softmax_d_k) for its
entry and at every beta in `betas` for the trend.
"""

from __future__ import annotations

import math
import time

import jax
import numpy as np

from tmem.memory.capacity import (STORES, capacity_formula, capacity_theory, find_capacity, interference_ratio,
                                  theory_ratio)
from tmem.probes.base import Probe, ProbeInput

DEFAULTS = {
    "d_k": 64,
    "d_v": None,  # value width; None means d_k
    "stores": ["hebbian", "lstsq", "relu", "relu2", "relu3", "softmax"],
    "softmax_d_k": 16,
    "beta": None,  # the softmax entry's beta; None means sqrt(softmax_d_k)
    "betas": [1, 2, 3, 4, 5],  # the softmax trend
    "queries": 512,  # queries pooled per ratio estimate
    "softmax_queries": 2048,  # the exponential read's ratio has heavier tails at its small d_k
    "rtol": 0.01,  # relative width of the search's final bracket
}


def measure(store: str, d_k: int, key: jax.Array, *, d_v=None, beta: float = 1.0, queries: int = 512,
            rtol: float = 0.01) -> dict:
    """One store's measured capacity beside its theory, with every ratio the search evaluated."""
    def ratio(M: int) -> float:
        return interference_ratio(store, key, M, d_k, d_v, queries=queries, beta=beta)

    capacity, curve = find_capacity(ratio, start=d_k, rtol=rtol)
    theory = capacity_theory(store, d_k, beta)
    return {
        "capacity": round(capacity, 2),
        "theory": round(theory, 2),
        "formula": None if (f := capacity_formula(store, d_k, beta)) is None else round(f, 2),
        "relative_error": round(capacity / theory - 1, 4),
        "d_k": d_k,
        "curve": {"M": [m for m, _ in curve], "ratio": [round(r, 5) for _, r in curve]},
    }


def capacity_table(options: dict, key: jax.Array) -> dict:
    """Every requested store's entry, keyed by store name."""
    o = {**DEFAULTS, **options}
    unknown = [s for s in o["stores"] if s not in STORES]
    if unknown:
        raise ValueError(f"options.capacity.stores: unknown {unknown}; allowed: {', '.join(STORES)}")
    start = time.perf_counter()
    out = {"d_k": o["d_k"], "queries": o["queries"], "rtol": o["rtol"]}
    common = dict(d_v=o["d_v"], queries=o["queries"], rtol=o["rtol"])
    for i, store in enumerate(o["stores"]):
        k = jax.random.fold_in(key, i)
        if store != "softmax":
            out[store] = measure(store, o["d_k"], k, **common)
            continue
        d = o["softmax_d_k"]
        beta = o["beta"] if o["beta"] is not None else math.sqrt(d)
        soft = {**common, "queries": o["softmax_queries"]}
        trend = [{**measure(store, d, k, beta=b, **soft), "beta": b} for b in sorted({*o["betas"], beta})]
        out[store] = {**next(e for e in trend if e["beta"] == beta), "trend": trend}
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out


def figure(table: dict):
    """Log-log ratio against M, the dashed line where interference equals signal, a dot per capacity."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    stores = [s for s in table if isinstance(table[s], dict) and "capacity" in table[s]]
    soft = table.get("softmax")
    fig = Figure(figsize=(11 if soft else 6, 4.2))
    axes = fig.subplots(1, 2 if soft else 1, squeeze=False)
    panels = [(axes[0, 0], [(s, table[s]) for s in stores if s != "softmax"],
               f"each store at d_k = {table['d_k']}")]
    if soft:
        panels.append((axes[0, 1], [(f"beta={e['beta']:g}", {**e, "store": "softmax"}) for e in soft["trend"]],
                       f"exponential read at d_k = {soft['d_k']}"))
    for ax, entries, title in panels:
        colors = colormaps["tab10"](np.arange(len(entries)) % 10)
        for (label, e), c in zip(entries, colors):
            store = e.get("store", label)
            M = np.unique(np.geomspace(2, max(4 * e["capacity"], 8), 200))
            ax.plot(M, np.maximum(theory_ratio(store, e["d_k"], M, e.get("beta", 1.0)), 1e-3), "--", color=c,
                    lw=0.8, alpha=0.7)
            ax.plot(e["curve"]["M"], e["curve"]["ratio"], "o", color=c, ms=3)
            ax.plot([e["capacity"]], [1.0], "o", color=c, ms=8, label=f"{label}: {e['capacity']:,.0f} "
                    f"(theory {e['theory']:,.0f})")
            if e.get("formula"):
                ax.plot([e["formula"]], [1.0], "x", color=c, ms=7, mew=1.5)
        ax.axhline(1.0, color="k", ls=":", lw=1)
        ax.set(xscale="log", yscale="log", xlabel="stored pairs M", ylabel="interference / signal",
               title=title, ylim=(1e-2, 10))
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("Capacity: measured (large dots; the search's points small), exact-moment theory (dashed), "
                 "the note's formula (x)", fontsize=9)
    fig.tight_layout()
    return fig


def run(inp: ProbeInput):
    key = inp.key if inp.key is not None else jax.random.key(0)
    table = capacity_table(inp.options, key)
    return table, {"capacity": figure(table)}


probe = Probe(
    run=run,
    needs_run=False,
    description="interference-to-signal ratio against stored pairs, and each store's capacity beside theory",
)
