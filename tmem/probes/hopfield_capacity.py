"""The capacity table's classical Hopfield entry: random binary patterns held, per N and criterion, over seeds.

    python eval.py 'probes=[capacity]' '+options.capacity.stores=[hopfield]' +options.capacity.hopfield_seeds=3

The network and its three criteria are memory/binary_hopfield.py's. Each
criterion's entry gives the measured capacity per seed, their mean and
standard deviation, the Gaussian-crosstalk `theory` and the large-N `law`
(N / (2 ln N), 0.185 N, 0.138 N), and the mean as a fraction of N.
"""

from __future__ import annotations

import numpy as np

from tmem.memory.binary_hopfield import CRITERIA, asymptotic, capacity, capacity_theory

LAWS = {"patterns_fixed": "N / (2 ln N)", "bits_one_update": "0.185 N", "bits_converged": "0.138 N"}


def hopfield_table(sizes, seeds: int, seed: int) -> dict:
    """{"seeds", "by_n": {N: {criterion: entry}}} for every N in `sizes`, `seeds` draws each."""
    by_n = {}
    for N in sorted({int(n) for n in sizes}):
        by_n[str(N)] = {}
        for j, criterion in enumerate(CRITERIA):
            caps = [capacity(N, criterion, np.random.default_rng([seed, N, j, s])) for s in range(seeds)]
            by_n[str(N)][criterion] = {
                "measured": caps, "mean": round(float(np.mean(caps)), 2), "sd": round(float(np.std(caps)), 2),
                "fraction_of_n": round(float(np.mean(caps)) / N, 4),
                "theory": round(capacity_theory(N, criterion), 2), "law": round(asymptotic(N, criterion), 2),
                "law_form": LAWS[criterion],
            }
    return {"seeds": seeds, "by_n": by_n}


def hopfield_figure(table: dict):
    """Capacity / N against N per criterion: measured (mean and spread), Gaussian theory, large-N law."""
    from matplotlib.figure import Figure

    sizes = [int(n) for n in table["by_n"]]
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for criterion, color in zip(CRITERIA, ("C0", "C1", "C2")):
        entries = [table["by_n"][str(N)][criterion] for N in sizes]
        ax.errorbar(sizes, [e["mean"] / N for e, N in zip(entries, sizes)],
                    yerr=[e["sd"] / N for e, N in zip(entries, sizes)], fmt="o", color=color, capsize=3,
                    label=f"{criterion} (law {LAWS[criterion]})")
        ax.plot(sizes, [e["theory"] / N for e, N in zip(entries, sizes)], "--", color=color, lw=1)
        ax.plot(sizes, [e["law"] / N for e, N in zip(entries, sizes)], ":", color=color, lw=1)
    ax.set(xscale="log", xlabel="units N", ylabel="capacity / N", ylim=(0, 0.25))
    ax.set_xticks(sizes, [str(N) for N in sizes])
    ax.minorticks_off()
    ax.legend(fontsize=7)
    ax.set_title(f"binary Hopfield network, {table['seeds']} seeds: measured (dots),\n"
                 "Gaussian theory (dashed), large-N law (dotted)", fontsize=9)
    fig.tight_layout()
    return fig
