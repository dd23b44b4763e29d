"""How a softmax head's read of a queried pair spreads as the context grows past the trained length.

The note's Chapter 13: "attention becomes uniform (diffuse) on a long
context", read in Chapter 6 as two terms. With M other keys, the target's
weight e^beta is small against the sum of the M others' weights; and even
when it is not, the others add value noise: for independent unit values
E||sum_i a_i v_i||^2 = sum_i a_i^2 (the note's D20 viii), so the noise
against the target's weight a_t is sqrt(sum_{i != t} a_i^2) / a_t, which
for random keys is the note's sqrt(M) e^(beta^2/d - beta). Both terms are
read here off a row of attention weights as the model computed it, not off
the formula: `crowd` = sum_{i != t} a_i / a_t and `noise` =
sqrt(sum_{i != t} a_i^2) / a_t.

The target is the queried pair, its key and the value after it (a trained
MQAR head reads one or the other: `dilution` reads the same pair), and the
head is the last layer's head that puts the most weight on it, per query.
The probe reads the trained model at each length n of the task (eval.py's
task overrides, tmem.train.task_overrides: a learned position table is
refused past its rows) and reports, per n, the held-out accuracy, the mean
entropy of those rows and of a uniform row over the same keys, the mean
target weight, where the rest of the row goes (the other pairs, the tokens
within the trained length of the query, those beyond it, and the key's
echoes in the filler), and the median over queries of the two terms (a
ratio over a weight near zero has a long tail, which a mean would follow).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from tasks import heldout
from tmem.probes.base import Probe, ProbeInput, mixers_without
from tmem.probes.heads import forward_with_attention
from tmem.probes.heldout import heldout_metrics
from tmem.train.task_overrides import with_task

LONGEST = 1024  # the longest default read length: [depth, B, H, n, n] attention per chunk stays small
EXAMPLES, CHUNK = 32, 8  # held-out sequences whose attention is read at each length, and how many per pass


def row_entropy(rows) -> np.ndarray:
    """-sum_i a_i log a_i of each row [..., S] (0 log 0 = 0: a masked key adds nothing)."""
    rows = np.asarray(rows, np.float64)
    return -np.sum(np.where(rows > 0, rows * np.log(np.where(rows > 0, rows, 1.0)), 0.0), axis=-1)


def reading_terms(rows, target) -> dict[str, np.ndarray]:
    """Per row [..., S] of attention weights and a mask [..., S] of its target keys: the entropy, the target's
    weight a_t, and the note's two terms, the others' weight over it and the value noise over it."""
    rows, target = np.asarray(rows, np.float64), np.asarray(target, bool)
    weight = np.sum(rows * target, axis=-1)
    others = np.where(target, 0.0, rows)
    with np.errstate(divide="ignore"):  # a target of weight 0 is infinitely outweighed
        return {"entropy": row_entropy(rows), "target_weight": weight,
                "crowd": others.sum(-1) / weight, "noise": np.sqrt(np.sum(others**2, axis=-1)) / weight}


def pair_rows(A, positions, distance) -> tuple[np.ndarray, np.ndarray]:
    """Each query's row in the last layer's head that weighs its pair most, and the pair's mask: [B, Q, S] each.

    A: [depth, B, H, T, S] attention; positions, distance: [B, Q] queries and their distances back to their keys.
    """
    A, positions = np.asarray(A[-1]), np.asarray(positions)
    key = positions - np.asarray(distance)
    S = A.shape[-1]
    rows = A[np.arange(A.shape[0])[:, None], :, positions]  # [B, Q, H, S]
    pair = (np.arange(S) == key[..., None]) | (np.arange(S) == key[..., None] + 1)  # [B, Q, S]
    best = np.argmax(np.sum(rows * pair[:, :, None], axis=-1), axis=-1)  # [B, Q]
    return np.take_along_axis(rows, best[..., None, None], axis=2)[:, :, 0], pair


def echoes(tokens, positions, distance) -> np.ndarray:
    """[B, Q, S]: the keys before each query, other than its pair, that hold its key token or follow one. A long
    MQAR sequence repeats the key among its random filler (each token about n / vocab times), and a head that
    reads "the token after my key" may read those as well as the pair."""
    tokens, positions = np.asarray(tokens), np.asarray(positions)
    key = positions - np.asarray(distance)
    query = np.take_along_axis(tokens, positions, axis=1)[..., None]  # [B, Q, 1]: the key token
    s = np.arange(tokens.shape[1])
    after = np.concatenate([np.full_like(tokens[:, :1], -1), tokens[:, :-1]], axis=1)  # the token before each s
    same = (tokens[:, None] == query) | (after[:, None] == query)
    return same & (s < positions[..., None]) & (s != key[..., None]) & (s != key[..., None] + 1)


WHERE = ("context_weight", "near_weight", "far_weight")


def where_weight(rows, pair, positions, context: int, span: int) -> dict[str, np.ndarray]:
    """Where a row's weight off the pair goes [B, Q] each: to the other pairs (the first `context` tokens), to
    the other tokens at most `span` back from the query (offsets training saw: span = the trained length), and
    to those further back (offsets it never saw)."""
    rows, pair, positions = np.asarray(rows), np.asarray(pair, bool), np.asarray(positions)
    s = np.arange(rows.shape[-1])
    in_context = (s < context) & ~pair
    near = (s > positions[..., None] - span) & ~pair & ~in_context
    return {"context_weight": np.sum(rows * in_context, -1), "near_weight": np.sum(rows * near, -1),
            "far_weight": np.sum(rows * ~(pair | in_context | near), -1)}


def read_at_length(model, task, span: int, examples: int = EXAMPLES) -> dict[str, float]:
    """The held-out accuracy on `task` and the reading terms of `examples` of its held-out sequences; `span`:
    the trained length, the offsets `near_weight` counts."""
    batch = heldout(task)
    context = 2 * task.num_kv_pairs * task.num_passes + 2 * task.distractor_pairs  # every pair's tokens
    terms: dict[str, list] = {}
    for i in range(0, min(examples, task.heldout_size), CHUNK):
        few = slice(i, min(i + CHUNK, examples))
        A = forward_with_attention(model, batch.inputs[few])[1]
        rows, pair = pair_rows(A, batch.positions[few], batch.meta["distance"][few])
        echo = echoes(batch.inputs[few], batch.positions[few], batch.meta["distance"][few])
        for name, value in {**reading_terms(rows, pair), "echo_weight": np.sum(rows * echo, axis=-1),
                            **where_weight(rows, pair, batch.positions[few], context, span)}.items():
            terms.setdefault(name, []).append(value.ravel())
        terms.setdefault("uniform_entropy", []).append(np.log(np.asarray(batch.positions[few]) + 1.0).ravel())
    terms = {name: np.concatenate(value) for name, value in terms.items()}
    return {"accuracy": heldout_metrics(model, task)["accuracy"],
            **{name: float(np.mean(terms[name])) for name in ("entropy", "uniform_entropy", "target_weight",
                                                                 "echo_weight", *WHERE)},
            **{name: float(np.median(terms[name])) for name in ("crowd", "noise")}}


def read_lengths(task, longest: int = LONGEST) -> list[int]:
    """The trained length doubled while the task's vocabulary still exceeds it (MQAR's distinct keys)."""
    lengths, n = [], task.seq_len
    while n <= longest and n < task.vocab:
        lengths.append(n)
        n *= 2
    return lengths


def diffusion_figure(rows, name: str):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 3.2))
    acc, where, ent, terms = fig.subplots(1, 4)
    n = rows["read_length"]
    acc.plot(n, rows["accuracy"], "o-", label="held-out accuracy")
    acc.plot(n, rows["target_weight"], "s--", label="weight on the pair")
    acc.set(ylim=(0, 1.05), xlabel="read length n")
    for key, mark in zip((*WHERE, "echo_weight"), "v<>^"):
        where.plot(n, rows[key], f"{mark}-", label=key.replace("_", " "))
    where.set(ylim=(0, 1.05), xlabel="read length n", ylabel="weight off the pair")
    ent.plot(n, rows["entropy"], "o-", label="best head's row")
    ent.plot(n, rows["uniform_entropy"], "k:", label="uniform row")
    ent.set(xlabel="read length n", ylabel="entropy (nats)")
    terms.plot(n, rows["crowd"], "o-", label="others' weight / target's")
    terms.plot(n, rows["noise"], "s-", label="value noise / target's")
    terms.set(xlabel="read length n", yscale="log")
    for ax in (acc, where, ent, terms):
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=7)
    fig.suptitle(f"{name}: reading a pair at lengths past training")
    fig.tight_layout()
    return fig


def run(inp: ProbeInput):
    """options.diffusion.lengths: the read lengths (default the trained length doubled up to 1,024 while below
    the vocabulary); options.diffusion.examples: sequences whose attention is read at each (default 32)."""
    lengths = [int(n) for n in inp.options.get("lengths", read_lengths(inp.cfg.task))]
    read = partial(read_at_length, inp.model, span=inp.cfg.task.seq_len,
                   examples=int(inp.options.get("examples", EXAMPLES)))
    per_length = [read(with_task(inp.cfg, {"seq_len": n}).task) for n in lengths]
    rows = {"read_length": lengths, **{k: [r[k] for r in per_length] for k in per_length[0]},
            "trained_length": int(inp.cfg.task.seq_len)}
    return rows, {"diffusion": diffusion_figure(rows, inp.cfg.layers[0].name)}


def applies(cfg) -> str | None:
    if cfg.task.name != "mqar":
        return f"needs an MQAR run, not {cfg.task.name!r}"
    if others := mixers_without(cfg, lambda m: m.name == "softmax"):
        return f"reads softmax attention weights in every layer, not {others!r}"
    return None


probe = Probe(
    run=run,
    applies=applies,
    description="softmax's read of the queried pair at lengths past training: entropy, target weight, noise",
)
