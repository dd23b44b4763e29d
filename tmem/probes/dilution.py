"""Held-out recall of an MQAR document against the length of a second, unqueried one placed before or after it.

The note's Chapter 13: "adding a document to the prompt dilutes another".
The second document's keys and values are disjoint from the queried
document's (`task.distractor_pairs`, tasks/mqar.py), so a fall in recall is
dilution, not overwriting. Softmax attention keeps every pair in its cache
but spends a budget of one per query and head over all of them; a fixed-state
memory evicts, by interference, decay or overwriting. Placed before, the
distractor is older than the queried pairs (a decaying state has faded it by
the queries); placed after, it is newer, and the queried pairs are older by
its whole length. For a softmax model the probe also reads that budget: the
weight the last layer's best head puts, from each query, on its own pair (its
key and the value after it), against the distractor's length.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import numpy as np

from tasks import heldout
from tmem.probes.base import Probe, ProbeInput
from tmem.probes.diffusion import pair_rows
from tmem.probes.heads import forward_with_attention
from tmem.probes.mqar_distance import compiled, recall_by_distance

PLACES = ("before", "after")
BUDGET_EXAMPLES = 100  # sequences whose attention the budget reads: [depth, B, H, T, T] stays small


def pair_weight(A, positions, distance) -> float:
    """The mean over queries of the largest weight any head of the last layer puts on the query's pair.

    A: [depth, B, H, T, S] attention; positions, distance: [B, Q] queries and their distances back to their keys.
    """
    rows, pair = pair_rows(A, positions, distance)
    return float(np.sum(rows * pair, axis=-1).mean())


def most_distractor_pairs(task) -> int:
    """The longest distractor the run's length and key vocabulary hold beside its queried pairs."""
    kv = task.num_kv_pairs
    return min((task.seq_len - 2 * kv * task.num_passes - 2 * kv) // 2, task.vocab // 2 - 1 - kv)


def recall_by_distractor(model, task, pairs: list[int], chunk: int = 500, attention=None) -> dict[str, list]:
    """Held-out accuracy on `task`'s queried pairs with each number of distractor pairs, in each place; given
    `attention` (tokens -> (logits, [depth, B, H, T, S])), also each place's `<place>_pair_weight`."""
    rows: dict[str, list] = {"distractor_pairs": list(pairs), "distractor_tokens": [2 * m for m in pairs]}
    forward = compiled(model)  # every distractor length has the same shapes: one compile
    for place in PLACES:
        rows[place], weights = [], []
        for m in pairs:
            batch = heldout(dataclasses.replace(task, distractor_pairs=m, distractor_place=place))
            rows[place].append(recall_by_distance(model, batch, chunk, forward)["overall_accuracy"])
            if attention is not None:
                few = slice(0, BUDGET_EXAMPLES)
                A = attention(batch.inputs[few])[1]
                weights.append(pair_weight(A, batch.positions[few], batch.meta["distance"][few]))
        if attention is not None:
            rows[f"{place}_pair_weight"] = weights
    return rows


def dilution_figure(rows, queried: int):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 3.2))
    ax = fig.subplots()
    for i, place in enumerate(PLACES):
        ax.plot(rows["distractor_tokens"], rows[place], "o-", color=f"C{i}", label=f"distractor {place}")
        if f"{place}_pair_weight" in rows:
            ax.plot(rows["distractor_tokens"], rows[f"{place}_pair_weight"], "s--", color=f"C{i}",
                    label=f"{place}: weight on the pair")
    ylabel = "held-out accuracy" + (" (o); weight (s)" if f"{PLACES[0]}_pair_weight" in rows else "")
    ax.set(xlabel="distractor length (tokens)", ylabel=ylabel, ylim=(0, 1.05),
           title=f"recall of {queried} queried pairs beside an unqueried document")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def run(inp: ProbeInput):
    """options.dilution.pairs: the distractor sizes in pairs (default: five steps from none to the most the
    run's length holds)."""
    task = inp.cfg.task
    most = most_distractor_pairs(task)
    pairs = [int(m) for m in inp.options.get("pairs", sorted({round(most * i / 4) for i in range(5)}))]
    softmax = all(layer.name == "softmax" for layer in inp.cfg.layers)  # one [B, H, T, T] pattern a layer
    rows = recall_by_distractor(inp.model, task, pairs, attention=partial(forward_with_attention, inp.model)
                                if softmax else None)
    rows["queried_pairs"] = int(task.num_kv_pairs)
    return rows, {"dilution": dilution_figure(rows, task.num_kv_pairs)}


probe = Probe(
    run=run,
    applies=lambda cfg: None if cfg.task.name == "mqar" else f"needs an MQAR run, not {cfg.task.name!r}",
    description="held-out recall of the queried pairs against an unqueried document's length, before or after",
)
