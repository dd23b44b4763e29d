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

The written stores (delta, rls, decayed) store the pairs one write at a time,
so a pair's read depends on its age; their entries add `ages`, the ratio of
the newest and of the oldest pair at the capacity (with the theory's for
decayed), and decayed's adds its `horizon`, the number of recent pairs an
endless stream keeps readable. Their knobs: `delta_beta` (1), `ridge` (1e-3),
`gamma` (1 - 1/d_k). The delta rule has no theory (None). Their capacities
lie under 2 d_k, so they cost a few seconds of the default run.

`hopfield` is the classical binary Hopfield network (hopfield_capacity.py):
patterns in {-1, +1}^N at each N of `hopfield_n`, `hopfield_seeds` draws each,
under three criteria of "stored", each with its own law.

The random-feature store (`stores=[performer]`, not in the default list)
estimates the exponential read at softmax_d_k and beta = sqrt(softmax_d_k)
with m of Performer's features; its entry is at the largest m of
`performer_features` and its `trend` at each.
"""

from __future__ import annotations

import math
import time

import jax
import numpy as np

from tmem.memory.capacity import (KNOBS, MAX_FEATURES, STORES, WRITTEN, capacity_formula, capacity_theory, default_knob,
                                  end_ratios, find_capacity, interference_ratio, theory_ratio)
from tmem.memory.capacity_writes import check_knob, decayed_age_ratio, decayed_horizon
from tmem.probes.base import Probe, ProbeInput
from tmem.probes.hopfield_capacity import hopfield_figure, hopfield_table

DEFAULTS = {
    "d_k": 64,
    "d_v": None,  # value width; None means d_k
    "stores": ["hebbian", "lstsq", "relu", "relu2", "relu3", "softmax", "delta", "rls", "decayed", "hopfield"],
    "softmax_d_k": 16,
    "beta": None,  # the softmax entry's beta; None means sqrt(softmax_d_k)
    "betas": [1, 2, 3, 4, 5],  # the softmax trend
    "queries": 512,  # queries pooled per ratio estimate
    "softmax_queries": 2048,  # the exponential read's ratio has heavier tails at its small d_k
    "rtol": 0.01,  # relative width of the search's final bracket
    "delta_beta": 1.0,  # the delta rule's write strength
    "ridge": 1e-3,  # the RLS store's ridge
    "gamma": None,  # the decayed store's gamma; None means 1 - 1/d_k
    "hopfield_n": [100, 200],  # the binary Hopfield network's sizes N
    "hopfield_seeds": 1,
    "performer_features": [16, 64, 256, 1024],  # the random-feature store's m, each at most MAX_FEATURES
}


def measure(store: str, d_k: int, key: jax.Array, *, d_v=None, knob: float | None = None, queries: int = 512,
            rtol: float = 0.01) -> dict:
    """One store's measured capacity beside its theory, with every ratio the search evaluated.

    A store with a knob records it under its name (beta, ridge, gamma); a written store
    adds `ages`, and the decayed store its theory's `horizon`.
    """
    knob = default_knob(store, d_k) if knob is None else knob

    def ratio(M: int) -> float:
        return interference_ratio(store, key, M, d_k, d_v, queries=queries, knob=knob)

    capacity, curve = find_capacity(ratio, start=d_k, rtol=rtol)
    theory = capacity_theory(store, d_k, knob)
    entry = {
        "capacity": round(capacity, 2),
        "theory": None if theory is None else round(theory, 2),
        "formula": None if (f := capacity_formula(store, d_k, knob)) is None else round(f, 2),
        "relative_error": None if theory is None else round(capacity / theory - 1, 4),
        "d_k": d_k,
        "curve": {"M": [m for m, _ in curve], "ratio": [round(r, 5) for _, r in curve]},
    }
    if store in KNOBS:
        entry[KNOBS[store]] = knob
    if store in WRITTEN:
        entry["ages"] = ages(store, d_k, key, max(2, round(capacity)), d_v=d_v, knob=knob, queries=queries)
    if store == "decayed":
        entry["horizon"] = round(decayed_horizon(d_k, knob), 2)
    return entry


def ages(store: str, d_k: int, key: jax.Array, M: int, *, d_v=None, knob: float, queries: int) -> dict:
    """The ratio of the newest and of the oldest of M pairs in a written store (theory's too for decayed)."""
    newest, oldest = end_ratios(store, key, M, d_k, d_v, queries=queries, knob=knob)
    out = {"M": M, "newest": round(newest, 4), "oldest": round(oldest, 4)}
    if store == "decayed":
        out["newest_theory"], out["oldest_theory"] = (round(float(decayed_age_ratio(d_k, M, knob, a)), 4)
                                                      for a in (0, M - 1))
    return out


def capacity_table(options: dict, key: jax.Array) -> dict:
    """Every requested store's entry, keyed by store name."""
    o = {**DEFAULTS, **options}
    unknown = [s for s in o["stores"] if s not in STORES and s != "hopfield"]
    if unknown:
        raise ValueError(f"options.capacity.stores: unknown {unknown}; allowed: {', '.join(STORES)}, hopfield")
    option = {"delta": "delta_beta", "rls": "ridge", "decayed": "gamma"}  # the written stores' knobs
    knobs = {store: default_knob(store, o["d_k"]) if o[name] is None else o[name] for store, name in option.items()}
    for store in [s for s in o["stores"] if s in knobs]:
        try:
            check_knob(store, knobs[store])
        except ValueError as e:
            raise ValueError(f"options.capacity.{option[store]}: {e}") from None
    if not all(1 <= m <= MAX_FEATURES for m in o["performer_features"]):
        raise ValueError(f"options.capacity.performer_features={list(o['performer_features'])}: each m must lie in "
                         f"1..{MAX_FEATURES}")
    start = time.perf_counter()
    out = {"d_k": o["d_k"], "queries": o["queries"], "rtol": o["rtol"]}
    common = dict(d_v=o["d_v"], queries=o["queries"], rtol=o["rtol"])
    for i, store in enumerate(o["stores"]):
        k = jax.random.fold_in(key, i)
        if store == "hopfield":
            out[store] = hopfield_table(o["hopfield_n"], int(o["hopfield_seeds"]),
                                        int(jax.random.randint(k, (), 0, 2**31 - 1)))
            continue
        if store == "performer":
            trend = [measure(store, o["softmax_d_k"], k, knob=m, **common) for m in sorted(o["performer_features"])]
            out[store] = {**trend[-1], "trend": trend}
            continue
        if store != "softmax":
            out[store] = measure(store, o["d_k"], k, knob=knobs.get(store), **common)
            continue
        d = o["softmax_d_k"]
        beta = o["beta"] if o["beta"] is not None else math.sqrt(d)
        soft = {**common, "queries": o["softmax_queries"]}
        trend = [measure(store, d, k, knob=b, **soft) for b in sorted({*o["betas"], beta})]
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
            knob = e.get(KNOBS.get(store, ""))
            M = np.unique(np.geomspace(2, max(4 * e["capacity"], 8), 200))
            if (expected := theory_ratio(store, e["d_k"], M, knob)) is not None:
                ax.plot(M, np.maximum(expected, 1e-3), "--", color=c, lw=0.8, alpha=0.7)
            ax.plot(e["curve"]["M"], e["curve"]["ratio"], "o", color=c, ms=3)
            if store in WRITTEN:
                label = f"{label} ({KNOBS[store]}={knob:.3g})"
            theory = "no theory" if e["theory"] is None else f"theory {e['theory']:,.0f}"
            ax.plot([e["capacity"]], [1.0], "o", color=c, ms=8, label=f"{label}: {e['capacity']:,.0f} ({theory})")
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
    figures = {}
    if any(isinstance(e, dict) and "capacity" in e for e in table.values()):  # the stores figure() draws
        figures["capacity"] = figure(table)
    if "hopfield" in table:
        figures["hopfield_capacity"] = hopfield_figure(table["hopfield"])
    return table, figures


probe = Probe(
    run=run,
    needs_run=False,
    description="interference-to-signal ratio against stored pairs, and each store's capacity beside theory",
)
