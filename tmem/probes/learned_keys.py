"""A capacity theory for learned keys (the note, Chapters 3, 4 and 12; its open question of Chapter 16): from the
keys a trained fast-weight layer wrote and the queries it read with, predict which MQAR pairs it can retrieve by
its write rule and read kernel alone, and compare with the pairs the model recalls.

Every write of Chapter 10 (add, decay, correct) is linear in the values, the delta rule's correction
beta k k^T S being linear in S, so the read at position t is r_t = sum_s W[t, s] v_s with weights W that depend
only on the keys, the queries, the decays and the write strengths: the read kernel on the layer's own keys. For
linear attention W[t, s] = q_t . k_s, the queries' Gram matrix against the keys (Chapter 3's crosstalk); for the
delta rule the same after every later write's correction (Chapter 4). `read_weights` finds W by replaying the
layer's own recurrence (tmem.memory.linear_state.recurrent) on one-hot values, so no rule is written twice.

Where a layer writes a pair is its own choice: with a short convolution, a token's key and value mix the tokens
before it, so pair j (key token at 2j, value token at 2j + 1) can be written at any of the convolution's
positions after its key (a trained model here writes it at 2j + 1, 2j + 2 or 2j + 3). `write_offset` takes, from
the keys alone, the offset whose token the queries weigh most in their reads (over the first chunk of sequences,
then kept), the same for every pair of a layer. For each held-out query, of pair j:

* `kernel`: retrievable when W puts more weight on pair j's write than on any other pair's: the keys alone, as if
  the values were orthogonal codes;
* `read`: retrievable when the replayed read r is closer in cosine to the value written for pair j than to any
  other pair's value: the keys and the layer's values, whose overlaps add the crosstalk the kernel leaves out;
* `read_written`: the same against every value written up to the query (key tokens, fillers, earlier queries
  too): the layer does not know which of its writes are pairs;
* `random_kernel`, `random_read`: the same with every written key replaced by an independent random unit key of
  the same d_k and each query by its pair's key exactly (values, write strengths and decays kept): Chapter 3's
  random-key store under the layer's rule, against which training the keys is measured;
* `signal_to_crosstalk` (and `random_signal_to_crosstalk`): the median over queries of W's weight on pair j's
  write over the root sum of squares of its weights on every other written token (the inverse of the note's
  interference-to-signal ratio).

Beside them: the model's measured recall of the same queries, how often each prediction agrees with it query by
query (and `chance_agreement_*`, what a guess of the same rate independent of the model's hits would), and the
keys written at the pairs (their effective rank, their mean squared cosine against 1/d_k and the random keys',
each query's cosine with its pair's key). A read's skip (Mamba-2's D v_t) and normaliser are not
the memory's: the kernel's ranking ignores them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from tmem.memory.linear_state import recurrent
from tmem.mixers import layer_of
from tmem.mixers.fast_weight import FastWeight
from tmem.probes.base import Probe, ProbeInput, mixers_without
from tmem.probes.memory_state import (effective_rank, heldout_pairs, mean_squared_cosine, read_through,
                                     stored_positions)

# pair_counts: held-out sets of these numbers of pairs (None: the trained task's), each lengthened to fit them;
# seed: the random keys' draw
DEFAULTS = {"sequences": 256, "chunk": 64, "pair_counts": None, "seed": 0}
PREDICTIONS = ("kernel", "read", "read_written")


# ---- the theory (pure) ----

@functools.partial(jax.jit, static_argnames="delta")
def read_weights(queries, keys, log_a=None, beta=None, *, delta: bool = False) -> jax.Array:
    """W [B, T, H, T]: the weight the read at each position gives each written token's value, the layer's write
    replayed with one-hot values (queries, keys [B, T, H, d_k], log_a [B, T, H, 1 or d_k], beta [B, T, H])."""
    B, T, H, _ = keys.shape
    one_hot = jnp.broadcast_to(jnp.eye(T)[None, :, None, :], (B, T, H, T))
    return recurrent(queries, keys, one_hot, log_a=log_a, beta=beta, delta=delta,
                     precision=jax.lax.Precision.HIGHEST)[0]


def retrieved(scores: np.ndarray, pair: np.ndarray) -> np.ndarray:
    """Whether each query's own pair scores strictly above every other pair: scores [..., Q, P], pair [..., Q]
    (a tie is no retrieval: keys that cannot be told apart hold nothing)."""
    scores = np.asarray(scores, np.float64)
    own = np.take_along_axis(scores, pair[..., None], -1)[..., 0]
    others = np.where(np.arange(scores.shape[-1]) == pair[..., None], -np.inf, scores)
    return own > others.max(-1)


def cosines(reads: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The cosine of every read [..., Q, d] with every value [..., P, d]: [..., Q, P]."""
    unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-30)  # noqa: E731
    return unit(np.asarray(reads, np.float64)) @ np.swapaxes(unit(np.asarray(values, np.float64)), -1, -2)


def nearest_value(reads: np.ndarray, values: np.ndarray, pair: np.ndarray) -> np.ndarray:
    """Whether each read [..., Q, d] is closer in cosine to its pair's value than to any other of values
    [..., P, d]."""
    return retrieved(cosines(reads, values), pair)


def nearest_written(reads: np.ndarray, values: np.ndarray, own: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Whether each read [..., Q, d] made at position `at` [..., Q] is closer in cosine to the value written at
    its pair's token `own` [..., Q] than to any other value written up to it (values [..., T, d]): the layer does
    not know which of its writes are pairs, so every value in it competes."""
    cos = cosines(reads, values)
    return retrieved(np.where(np.arange(cos.shape[-1]) <= at[..., None], cos, -np.inf), own)


def signal_to_crosstalk(weights: np.ndarray, own: np.ndarray) -> np.ndarray:
    """A read's weight on its own pair's write over the root sum of squares of its weights on every other token:
    weights [..., Q, T], own [..., Q] the written token of each query's pair."""
    weights = np.asarray(weights, np.float64)
    signal = np.take_along_axis(weights, own[..., None], -1)[..., 0]
    rest = np.sum(weights ** 2, -1) - signal ** 2
    return np.abs(signal) / np.sqrt(np.maximum(rest, 1e-300))


def chance(predicted: float, measured: float) -> float:
    """The agreement of two independent hit-or-miss guesses with these rates: p m + (1 - p)(1 - m)."""
    return predicted * measured + (1 - predicted) * (1 - measured)


def unit_keys(key: jax.Array, shape) -> np.ndarray:
    """Independent random unit vectors along the last axis."""
    x = np.asarray(jax.random.normal(key, shape), np.float64)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def key_measures(keys: np.ndarray) -> dict[str, float]:
    """The keys written at the pairs [N, H, P, d]: effective rank of each sequence's [P, d] and the mean squared
    cosine between distinct pairs' keys, means over sequences and heads."""
    s = np.linalg.svd(np.asarray(keys, np.float64), compute_uv=False)
    return {"effective_rank": float(effective_rank(s).mean()), "mean_cos2": float(mean_squared_cosine(keys).mean())}


# ---- the probe ----

def _gather(x, index):
    """x [N, T, H, ...] at index [N, Q] -> [N, H, Q, ...]."""
    picked = np.take_along_axis(np.asarray(x), index.reshape(index.shape + (1,) * (x.ndim - 2)), 1)
    return np.moveaxis(picked, 2, 1)


def queried_pairs(inputs: np.ndarray, positions: np.ndarray, task) -> tuple[np.ndarray, np.ndarray]:
    """Each query's pair (which context key its token is) [N, Q] and the pairs' key tokens' positions [P] (of the
    last pass)."""
    key_positions = stored_positions(task)[0][-task.num_kv_pairs:]  # the last pass's keys, in pair order
    key_tokens = inputs[:, key_positions]  # [N, P]
    queried = np.take_along_axis(inputs, positions, 1)
    return np.argmax(queried[..., None] == key_tokens[:, None, :], -1), key_positions


def write_offset(weights: np.ndarray, pair: np.ndarray, key_positions: np.ndarray, offsets) -> tuple[int, list]:
    """Where the layer writes a pair, from its keys alone: the offset o (tokens after the pair's key token) whose
    token the queries weigh most, on average, in their reads (weights [..., Q, T], pair [..., Q]); and the mean
    weight at each offset."""
    means = [float(np.take_along_axis(weights, (key_positions[pair] + o)[..., None], -1).mean()) for o in offsets]
    return list(offsets)[int(np.argmax(means))], means


def _predictions(W, values, pos, pair, written) -> dict[str, np.ndarray]:
    """Per query [N, H, Q], from the read weights W [N, H, Q, T] and the values written [N, T, H, d_v]: whether
    the kernel and the read retrieve the query's pair (the read among the pairs' values, and among every value
    written up to the query), and the kernel's signal-to-crosstalk ratio."""
    values = np.moveaxis(np.asarray(values, np.float64), 2, 1)  # [N, H, T, d_v]
    reads = W @ values
    pair_h = np.broadcast_to(pair[:, None], W.shape[:-1])
    own = written[pair_h]
    return {"kernel": retrieved(W[..., written], pair_h), "read": nearest_value(reads, values[:, :, written], pair_h),
            "read_written": nearest_written(reads, values, own, pos[:, None]),
            "signal_to_crosstalk": signal_to_crosstalk(W, own)}


def _layer(sown, delta, pos, pair, key_positions, offsets, key) -> dict:
    """One layer's predictions on one chunk of sequences, with the trained keys and with random ones."""
    values, log_a, beta = sown["writes"]
    keys, queries = np.asarray(sown["keys"]), np.asarray(sown["queries"])
    W = _gather(read_weights(queries, keys, log_a, beta, delta=delta), pos)  # [N, H, Q, T]
    offset, at_offsets = write_offset(W, pair[:, None], key_positions, offsets)
    written = key_positions + offset
    rows = np.arange(len(pos))[:, None]
    random = unit_keys(key, keys.shape)
    random_q = random.copy()  # every query is its pair's key exactly: the best a random store can be read
    random_q[rows, pos] = random[rows, written[pair]]
    W_random = _gather(read_weights(random_q, random, log_a, beta, delta=delta), pos)
    pair_keys = np.moveaxis(keys[:, written], 2, 1)  # [N, H, P, d_k]
    q_own = _gather(queries, pos)  # [N, H, Q, d_k]
    k_own = np.take_along_axis(pair_keys, np.broadcast_to(pair[:, None], q_own.shape[:-1])[..., None], 2)
    return {**_predictions(W, values, pos, pair, written),
            **{f"random_{name}": x for name, x in _predictions(W_random, values, pos, pair, written).items()},
            "query_key_cosine": np.sum(q_own * k_own, -1) / np.maximum(
                np.linalg.norm(q_own, axis=-1) * np.linalg.norm(k_own, axis=-1), 1e-30),
            "pair_keys": pair_keys, "random_pair_keys": np.moveaxis(random[:, written], 2, 1),
            "offset": offset, "weight_at_offsets": at_offsets}


def learned_keys(model, batch, task, chunk: int = 64, seed: int = 0) -> dict:
    """The report over held-out MQAR sequences of one pair count (`batch`: inputs [N, T], positions, targets
    and mask [N, Q])."""
    inputs, positions = np.asarray(batch.inputs), np.asarray(batch.positions)
    pair, key_positions = queried_pairs(inputs, positions, task)
    scored = np.asarray(batch.mask) > 0
    measured, found, key = [], {}, jax.random.key(seed)
    chosen = {}  # each layer's write offset, from the first chunk
    for start in range(0, inputs.shape[0], chunk):
        part = slice(start, start + chunk)
        logits, _, sown = read_through(model, batch.inputs[part], ("keys", "queries", "writes"))
        hits = np.argmax(np.take_along_axis(np.asarray(logits), positions[part][..., None], 1), -1)
        measured.append(hits == np.asarray(batch.targets[part]))
        for i, s in enumerate(sown):
            layer = model.blocks[i % len(model.blocks)].mixer
            if isinstance(layer, FastWeight):
                key, sub = jax.random.split(key)
                # a pair is written at its key token or within the short convolution's reach after it
                offsets = chosen.get(i, range(max(layer.cfg.short_conv, 2)))
                found.setdefault(i, []).append(_layer(s, layer.cfg.rule == "delta", positions[part], pair[part],
                                                      key_positions, offsets, sub))
                chosen[i] = [found[i][0]["offset"]]
    measured = np.concatenate(measured)
    layers = {}
    for i, parts in found.items():
        got = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]
               if name not in ("offset", "weight_at_offsets")}
        mask = np.broadcast_to(scored[:, None], got["kernel"].shape)
        truth = np.broadcast_to(measured[:, None], mask.shape)
        d_k = got["pair_keys"].shape[-1]
        predictions = [f"{prefix}{p}" for prefix in ("", "random_") for p in PREDICTIONS]
        layers[str(i)] = {
            "d_key": int(d_k), "write_offset": int(parts[0]["offset"]),
            **{p: float(got[p][mask].mean()) for p in predictions},
            **{f"agreement_{p}": float((got[p] == truth)[mask].mean()) for p in PREDICTIONS},
            # what a prediction of the same recall would agree by if it were independent of the model's hits
            **{f"chance_agreement_{p}": float(chance(got[p][mask].mean(), truth[mask].mean()))
               for p in PREDICTIONS},
            **{name: float(np.median(got[name][mask]))
               for name in ("signal_to_crosstalk", "random_signal_to_crosstalk", "query_key_cosine")},
            "keys": key_measures(got["pair_keys"]), "random": key_measures(got["random_pair_keys"]),
            "random_key_cos2": 1.0 / d_k, "weight_at_offsets": parts[0]["weight_at_offsets"]}
    return {"pairs": task.num_kv_pairs, "sequences": int(inputs.shape[0]),
            "measured": float(measured[scored].mean()), "layers": layers}


def by_pairs_report(reports: list[dict]) -> dict:
    """One report per pair count as curves, lists over `pairs` (what tmem.sweeps.probe_curves folds over seeds)."""
    flat = {"pairs": [r["pairs"] for r in reports], "measured": [r["measured"] for r in reports], "layers": {}}
    for i, first in reports[0]["layers"].items():
        curves = {name: [r["layers"][i][name] for r in reports] for name, v in first.items()
                  if isinstance(v, (int, float, list))}
        for group in ("keys", "random"):
            curves.update({f"{group}_{name}": [r["layers"][i][group][name] for r in reports] for name in first[group]})
        flat["layers"][i] = curves
    return flat


def figure(report: dict):
    """Per layer, against the pairs: the predicted recall (kernel, read, random keys) and the measured one; and
    the signal-to-crosstalk ratio of the trained keys and of random ones."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 3.2 * len(report["layers"])))
    axes = fig.subplots(len(report["layers"]), 2, squeeze=False)
    for (left, right), (i, curves) in zip(axes, report["layers"].items()):
        left.plot(report["pairs"], report["measured"], "ko-", label="measured (the model)")
        for name in PREDICTIONS:
            left.plot(report["pairs"], curves[name], "o--", label=f"predicted: {name}")
            left.plot(report["pairs"], curves[f"random_{name}"], ":", label=f"random keys: {name}")
        left.set(xlabel="pairs", ylabel="recall", ylim=(0, 1.02), title=f"layer {i} (d_k = {curves['d_key'][0]})")
        right.plot(report["pairs"], curves["signal_to_crosstalk"], "o-", label="trained keys")
        right.plot(report["pairs"], curves["random_signal_to_crosstalk"], "o--", label="random keys")
        right.set(xlabel="pairs", ylabel="median signal / crosstalk", yscale="log", title="the kernel's margin")
        for ax in (left, right):
            ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def run(inp: ProbeInput):
    """The trained task's held-out set, or (options.learned_keys.pair_counts) one per number of pairs, each as long
    as its pairs need."""
    o = {**DEFAULTS, **inp.options}
    task, reports = inp.cfg.task, []
    for pairs in o["pair_counts"] or [task.num_kv_pairs]:
        at, batch = heldout_pairs(task, pairs, o["sequences"])
        reports.append(learned_keys(inp.model, batch, at, o["chunk"], o["seed"]))
    report = by_pairs_report(reports)
    return report, {"learned_keys": figure(report)}


def _applies(cfg):
    if cfg.task.name != "mqar":
        return f"needs an MQAR run, not {cfg.task.name!r}"
    if others := mixers_without(cfg, lambda m: issubclass(layer_of(m), FastWeight)):
        return f"reads a fast-weight row's layer (a write linear in its values) in every layer, not {others!r}"
    return None


probe = Probe(
    run=run,
    applies=_applies,
    description="which MQAR pairs each fast-weight layer's keys let it retrieve (its write replayed on its own "
                "keys and queries, and on random keys) against the pairs the model recalls",
)
