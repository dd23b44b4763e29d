"""Chapter 14 at scale: edit many stored facts of a memorize run at once (MEMIT) or one after another.

    python eval.py run=<memorize run> 'probes=[many_edits]'
    python eval.py run=<memorize run> 'probes=[many_edits]' '+options.many_edits.counts=[1,8,64]'

The memory, the facts' keys h_i, the new values and their targets v* are the
rank_one_edit probe's (the last MLP's output matrix; v* by Adam steps on the
output at h* until the new value has probability p_new). For each count n of
edits (the first n of one random draw of stored facts, so counts are nested)
two updates write all n from the original matrix:

* MEMIT: Delta = C^-1 K_E^T (lam I + K_E C^-1 K_E^T)^-1 R (memory/stores.py many_edit),
  C the facts' uncentred key second moment (mean h h^T, the preserved keys'),
  R the residuals v* - W^T h* at the edited keys;
* sequential: n whitened rank-one edits with the same C, each applied to the
  matrix the previous one left, as ROME applied one edit at a time.

Reported per count and kind: efficacy (the share of the n edited facts now
giving their new value) and damage (the share of the other stored facts no
longer giving theirs), with the RMS change of the other facts' outputs.
`lam` is relative to the mean second moment, against which a typical key has
h^T C^-1 h about its width (the hidden units), so lam much below that lands the
edits almost exactly and lam comparable to it trades edits for preserved keys.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tmem.config import ConfigError
from tmem.memory.stores import many_edit, rank_one_edit
from tmem.probes.base import Probe, ProbeInput
from tmem.probes.rank_one_edit import DEFAULTS as EDIT_DEFAULTS
from tmem.probes.rank_one_edit import applies, pick_edits, prepare, value_finder

DEFAULTS = {**{k: v for k, v in EDIT_DEFAULTS.items() if k != "edits"}, "counts": [1, 2, 4, 8, 16, 32, 64],
            "lam": 0.01}
KINDS = ("memit", "sequential")


def score(after: np.ndarray, m: dict, edited: np.ndarray, new_values: np.ndarray, W2: jax.Array) -> dict:
    """Efficacy and damage of the matrix W2 whose predictions are `after`, for the facts `edited`."""
    others = np.ones(len(after), bool)
    others[edited] = False
    kept = m["stored"] & others
    base = np.asarray(m["H"] @ m["W"])[others]
    change = np.asarray(m["H"] @ W2)[others] - base
    return {"efficacy": float(np.mean(after[edited] == new_values)),
            "damage": float(np.mean(after[kept] != m["values"][kept])),
            "facts_lost": int(np.sum(after[kept] != m["values"][kept])),
            "output_change": float(np.sqrt(np.mean(np.sum(change**2, -1)) / np.mean(np.sum(base**2, -1))))}


def run(inp: ProbeInput):
    o = {**DEFAULTS, **inp.options}
    counts = sorted({int(n) for n in o["counts"]})
    if not counts or counts[0] < 1:
        raise ConfigError("options.many_edits.counts: name counts of edits >= 1, e.g. [1, 2, 4, 8]")
    task = inp.cfg.task
    m = prepare(inp, o)
    key = inp.key if inp.key is not None else jax.random.key(0)
    picked, new_values = pick_edits(key, m["stored"], m["values"], counts[-1], task.num_values)
    counts = [n for n in counts if n <= len(picked)]
    target_output = value_finder(m["with_kernel"], m["W"], task.num_facts, o)
    V_star = jnp.stack([target_output(m["H"][i], m["inputs"][i], jnp.int32(v)) for i, v in zip(picked, new_values)])
    rows = {kind: [] for kind in KINDS}
    sequential, done = m["W"], 0
    for n in counts:
        K_E = m["H"][picked[:n]]
        memit = m["W"] + many_edit(m["W"], K_E, V_star[:n], m["C"], o["lam"])
        for i in range(done, n):  # the sequential edits go on from where the last count stopped
            sequential = rank_one_edit(sequential, K_E[i], V_star[i], m["C"])
        done = n
        for kind, W2 in (("memit", memit), ("sequential", sequential)):
            rows[kind].append({"edits": n, **score(np.asarray(m["predict"](W2)), m, picked[:n], new_values[:n], W2)})
    metrics = {"facts": int(task.num_facts), "stored_before": int(m["stored"].sum()), "lam": o["lam"],
               "counts": counts, **rows}
    return metrics, {"many_edits": figure(metrics)}


def figure(metrics: dict):
    """Efficacy and damage against the number of edits, MEMIT beside sequential rank-one edits."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 3.2))
    axes = fig.subplots(1, 2)
    for ax, key, label in ((axes[0], "efficacy", "edited facts now recalled"),
                           (axes[1], "damage", "other stored facts lost")):
        for kind, style in zip(KINDS, ("o-", "s--")):
            ax.plot(metrics["counts"], [r[key] for r in metrics[kind]], style, ms=4, label=kind)
        ax.set(xscale="log", xlabel="facts edited", ylabel="share", title=label)
        ax.set_xticks(metrics["counts"], [str(n) for n in metrics["counts"]])
        ax.legend(fontsize=8)
    fig.suptitle(f"many edits of a memorize model ({metrics['stored_before']} of {metrics['facts']} facts stored, "
                 f"lam = {metrics['lam']:g})", fontsize=10)
    fig.tight_layout()
    return fig


probe = Probe(run=run, applies=applies,
              description="MEMIT's many-fact edit against sequential rank-one edits: efficacy and damage per count")
