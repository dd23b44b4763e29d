"""The fast memory a trained MQAR model ends a sequence with: how many directions it uses, and how much the keys
written into it overlap, against the note's prediction for random keys.

Chapter 3 of the note reads an outer-product memory by W k_j = v_j + sum_{i != j} (k_i . k_j) v_i: the
interference is set by the overlaps of the stored keys, and for random unit keys in d_k dimensions
E[cos^2] = 1/d_k (Derivation D1), so recall degrades like sqrt((M - 1)/d_k) and the memory is full near
M = d_k pairs. This probe puts the two sides next to each other on held-out sequences:

* the final state of every layer whose memory is a matrix (the fast-weight rows, mesa's G, TTT-Linear's and
  a linear Titans' weights, LSA's store): each head's singular values, its effective rank and the number of
  directions holding 90% of its squared Frobenius norm;
* the keys the layer wrote at the context's key positions (what enters the state: after the short
  convolution, feature map and normalisation), as the mean squared cosine between distinct stored keys,
  beside 1/d_k. A model with a short convolution can write a pair at its value token instead (the key
  token is then the convolution's previous token), so the keys written at the value positions are
  measured too. The prediction is for zero-mean directions: a non-negative feature map (elu + 1, relu)
  gives keys that share a mean direction, whose cosines sit far above 1/d_k before any training.

Keys are read through the `keys` intermediate of each layer that declares it sows them (`Mixer.sows`; a
no-op outside `nnx.capture`), so the layers' math is not repeated here, and the matrix through the state's
own `matrix`. Layers whose state is no matrix (softmax's and Hopfield's caches, an MLP memory, no mixer)
are reported as such, in their state's words. `key_cosines_figure` shows one sequence's stored keys' cosines
(notebooks/mqar_memory.py).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
from flax import nnx

from tasks import heldout
from tmem.mixers.base import NoMatrix
from tmem.probes.base import Probe, ProbeInput

DEFAULTS = {"sequences": 512, "chunk": 128}  # a modest held-out sample; options.memory_state may change either
DEFINITIONS = {
    "effective_rank": "exp of the entropy of the singular values normalised to sum 1 (Roy & Vetterli 2007)",
    "rank90": "the fewest singular values whose squares hold 90% of the squared Frobenius norm",
    "key_interference": "mean cos^2 between the keys written at distinct pairs' key positions",
    "key_interference_at_values": "the same for the keys written at the pairs' value positions",
    "predicted_crosstalk": "E[cos^2] = 1/d_k for random unit keys in the state's key width d_k (note, D1)",
}


# ---- the measures (pure) ----

def effective_rank(s: np.ndarray) -> np.ndarray:
    """exp(-sum p_i log p_i), p = s / sum(s), over the last axis of singular values s (Roy & Vetterli 2007).

    r equal nonzero values give r; a zero matrix gives 0 (no direction is used).
    """
    s = np.asarray(s, np.float64)
    total = s.sum(-1, keepdims=True)
    p = np.divide(s, total, out=np.zeros_like(s), where=total > 0)
    entropy = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)
    return np.where(total[..., 0] > 0, np.exp(entropy), 0.0)


def rank_at(s: np.ndarray, fraction: float = 0.9) -> np.ndarray:
    """The fewest leading singular values (s sorted descending, last axis) whose squares reach `fraction` of
    the squared Frobenius norm, sum s^2; 0 for a zero matrix."""
    energy = np.cumsum(np.square(np.asarray(s, np.float64)), axis=-1)
    total = energy[..., -1:]
    # a tiny slack, so a fraction met exactly is not lost to rounding
    reached = energy >= fraction * total * (1 - 1e-9)
    return np.where(total[..., 0] > 0, np.argmax(reached, axis=-1) + 1, 0)


def cosine_gram(keys: np.ndarray) -> np.ndarray:
    """The cosines between keys [..., n, d], [..., n, n]; a zero key has cosine 0 with all (itself included)."""
    keys = np.asarray(keys, np.float64)
    norm = np.linalg.norm(keys, axis=-1, keepdims=True)
    unit = np.divide(keys, norm, out=np.zeros_like(keys), where=norm > 0)
    return unit @ np.swapaxes(unit, -1, -2)


def mean_squared_cosine(keys: np.ndarray, labels: np.ndarray | None = None) -> np.ndarray:
    """Mean cos^2 between keys [..., n, d] over the pairs i != j with different labels [n] (every pair i != j
    when labels is None): the off-diagonal of the keys' cosine Gram matrix. A zero key has cosine 0 with all."""
    gram = cosine_gram(keys)
    n = gram.shape[-1]
    labels = np.arange(n) if labels is None else np.asarray(labels)
    pairs = labels[:, None] != labels[None, :]
    return np.square(gram)[..., pairs].mean(-1)


def predicted_crosstalk(d_key: int) -> float:
    """E[(k_i . k_j)^2] for independent random unit keys in d_key dimensions (the note's Derivation D1)."""
    return 1.0 / d_key


def stored_positions(task) -> tuple[np.ndarray, np.ndarray]:
    """The context's key positions in an MQAR sequence and which pair each holds: pair j's key sits at
    2 j of every pass's block of 2 kv tokens (tasks/mqar.py), its value one later."""
    kv, passes = task.num_kv_pairs, task.num_passes
    pair = np.tile(np.arange(kv), passes)
    return 2 * kv * np.repeat(np.arange(passes), kv) + 2 * pair, pair


def heldout_pairs(task, pairs: int, sequences: int):
    """The task with `pairs` pairs (lengthened to fit them: half its tokens a query region) and the first
    `sequences` of its held-out set."""
    at = dataclasses.replace(task, num_kv_pairs=pairs, seq_len=max(task.seq_len, 4 * pairs * task.num_passes))
    batch = heldout(at)
    return at, batch.replace(**{f: getattr(batch, f)[:sequences] for f in ("inputs", "targets", "mask", "positions")})


# ---- the rows' matrices ----

def matrix_memory(layer, state) -> tuple[np.ndarray | None, str | None]:
    """The final state's matrix [B, H, d_k, d_v] (key-major, read x S) and None, or None and why there is none:
    as the state's own `matrix` reads it (tmem.mixers.base.MixerState.matrix)."""
    try:
        return np.asarray(state.matrix(layer)), None
    except NoMatrix as e:
        return None, f"no matrix state: {e}"


@functools.partial(jax.jit, static_argnums=(0, 3))
def _forward(graphdef, params, tokens, names):
    model = nnx.merge(graphdef, params)
    (logits, states), inter = nnx.capture(model.forward, nnx.Intermediate)(tokens)
    n, sown = len(model.blocks), []
    for i in range(len(states)):  # a tied block sows one entry per application
        mixer = _child(_child(_child(inter, "blocks"), i % n), "mixer")
        sown.append({name: mixer[name][i // n] for name in names if name in model.blocks[i % n].mixer.sows})
    return logits, states, sown


def _child(tree, name):
    """A sub-tree of captured intermediates, empty where a module sowed nothing."""
    return tree[name] if name in tree else {}


def read_through(model, tokens, names: tuple[str, ...]) -> tuple[jax.Array, list, list[dict]]:
    """The logits at every position, every block application's final mixer state, and what its mixer sowed
    under each of `names` (those it declares in `Mixer.sows`), in one compiled forward pass."""
    graphdef, params = nnx.split(model)
    return _forward(graphdef, params, tokens, names)


def captured(model, tokens, names: tuple[str, ...]) -> tuple[list, list[dict]]:
    """`read_through` without the logits: the states and what was sown."""
    return read_through(model, tokens, names)[1:]


def written(model, tokens) -> tuple[list, list]:
    """Every block application's final mixer state, and the keys it wrote [B, T, H, d_k] (None for a row
    that sows none)."""
    states, sown = captured(model, tokens, ("keys",))
    return states, [s.get("keys") for s in sown]


# ---- the probe ----

def _layer_sums(matrix, keys, positions, pairs) -> dict[str, np.ndarray]:
    """Per-head sums over the batch of every measure (divided by the sequence count at the end)."""
    s = np.linalg.svd(matrix.astype(np.float64), compute_uv=False)  # [B, H, r], descending
    sums = {"singular_values": s.sum(0), "effective_rank": effective_rank(s).sum(0),
            "rank90": rank_at(s).sum(0).astype(np.float64)}
    if keys is not None and len(set(pairs.tolist())) > 1:  # one pair has no other key to cross
        keys = np.moveaxis(np.asarray(keys), 2, 1)  # [B, H, T, d]
        sums["key_interference"] = mean_squared_cosine(keys[:, :, positions], pairs).sum(0)
        sums["key_interference_at_values"] = mean_squared_cosine(keys[:, :, positions + 1], pairs).sum(0)
    return sums


def memory_state(model, inputs, task, chunk: int = 128) -> dict:
    """The report over token sequences `inputs` [N, T] of an MQAR task: per layer, per head means (see
    DEFINITIONS), or the reason a layer has no matrix state."""
    positions, pairs = stored_positions(task)
    N, sums, layers = inputs.shape[0], {}, {}
    for start in range(0, N, chunk):
        states, keys = written(model, inputs[start:start + chunk])
        for i, (state, k) in enumerate(zip(states, keys)):
            layer = model.blocks[i % len(model.blocks)].mixer
            matrix, why = matrix_memory(layer, state)
            if matrix is None:
                layers[str(i)] = {"mixer": type(layer).__name__, "matrix_state": False, "reason": why}
                continue
            part = _layer_sums(matrix, k, positions, pairs)
            sums[i] = part if i not in sums else {name: sums[i][name] + part[name] for name in part}
            layers[str(i)] = {"mixer": type(layer).__name__, "matrix_state": True, "shape": list(matrix.shape[2:]),
                              "d_key": int(matrix.shape[2])}
    for i, total in sums.items():
        report = layers[str(i)]
        report.update({name: (value / N).tolist() for name, value in total.items()})
        report["predicted_crosstalk"] = predicted_crosstalk(report["d_key"])
        for name in ("effective_rank", "rank90", "key_interference"):
            if name in report:
                report[f"mean_{name}"] = float(np.mean(report[name]))
    return {"sequences": int(N), "pairs": task.num_kv_pairs, "passes": task.num_passes,
            "definitions": DEFINITIONS, "layers": layers}


def spectra_figure(rows: dict, pairs: int):
    """Each matrix layer's mean singular values per head (`memory_state`'s report), normalised to the largest."""
    from matplotlib.figure import Figure

    matrices = {i: r for i, r in rows["layers"].items() if r["matrix_state"]}
    fig = Figure(figsize=(3.2 * len(matrices) + 0.6, 3.2))
    for ax, (i, r) in zip(fig.subplots(1, len(matrices), squeeze=False)[0], matrices.items()):
        for h, s in enumerate(r["singular_values"]):
            s = np.asarray(s)
            ax.plot(np.arange(1, len(s) + 1), np.maximum(s / max(s[0], 1e-30), 1e-4), "o-", ms=3,
                    label=f"head {h}: erank {r['effective_rank'][h]:.1f}")
        ax.axvline(pairs, color="gray", ls=":", label=f"{pairs} pairs")
        ax.set(yscale="log", ylim=(1e-3, 1.5), xlabel="singular value index", title=f"layer {i} ({r['mixer']})")
        ax.legend(fontsize=6)
    fig.axes[0].set_ylabel("mean singular value / largest")
    fig.suptitle("final state's spectrum (held-out MQAR)", fontsize=9)
    fig.tight_layout()
    return fig


def _interference_figure(rows: dict):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 3.2))
    ax = fig.subplots()
    x, ticks = 0, []
    for i, r in rows["layers"].items():
        if not r["matrix_state"] or "key_interference" not in r:
            continue
        heads = np.arange(len(r["key_interference"]))
        ax.bar(x + heads, r["key_interference"], color="C0", label="at key positions" if x == 0 else None)
        ax.plot(x + heads, r["key_interference_at_values"], "s", color="C1",
                label="at value positions" if x == 0 else None)
        ax.hlines(r["predicted_crosstalk"], x - 0.4, x + heads[-1] + 0.4, color="k", ls="--",
                  label="1/d_k (random keys)" if x == 0 else None)
        ticks += [(x + h, f"L{i} h{h}") for h in heads]
        x += len(heads) + 1
    ax.set_xticks([t for t, _ in ticks], [name for _, name in ticks], fontsize=7)
    ax.set(ylabel="mean cos^2, distinct stored keys", title="key interference against the random-key crosstalk")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def key_cosines_figure(keys: list, task, example: int = 0):
    """One sequence's keys as its matrix layers wrote them over the context: their cosines, per layer and head.

    `keys` is `written`'s list ([B, T, H, d_k] per block application, None for a row that sows none). Reading
    a sum of outer products with the key of pair j returns v_j plus every other stored value weighted by its
    key's overlap with k_j (note, Chapter 3): the off-diagonal here is that crosstalk for the add rule, and
    what the delta rule corrects as it writes. Both the key and the value tokens are shown, since a short
    convolution can write a pair at its value token.
    """
    from matplotlib.figure import Figure

    context = 2 * task.num_kv_pairs * task.num_passes
    labels = [f"{'KV'[t % 2]}{t // 2 % task.num_kv_pairs + 1}" for t in range(context)]
    layers = [(i, np.moveaxis(np.asarray(k)[example, :context], 1, 0)) for i, k in enumerate(keys) if k is not None]
    heads = layers[0][1].shape[0]
    fig = Figure(figsize=(2.4 * heads + 0.8, 2.4 * len(layers) + 0.4), layout="constrained")
    axes = fig.subplots(len(layers), heads, squeeze=False)
    for row, (i, k) in zip(axes, layers):
        gram = cosine_gram(k)  # [H, C, C]
        for h, ax in enumerate(row):
            image = ax.imshow(gram[h], cmap="RdBu", vmin=-1, vmax=1)
            ax.set_xticks(range(context), labels, fontsize=5, rotation=90)
            ax.set_yticks(range(context), labels, fontsize=5)
            ax.set_title(f"layer {i} head {h}", fontsize=8)
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="cosine")
    fig.suptitle("cosines of the keys written over one context (K: key tokens, V: value tokens)", fontsize=9)
    return fig


def run(inp: ProbeInput):
    o = {**DEFAULTS, **inp.options}
    batch = heldout(inp.cfg.task)
    rows = memory_state(inp.model, batch.inputs[:o["sequences"]], inp.cfg.task, chunk=o["chunk"])
    if not any(r["matrix_state"] for r in rows["layers"].values()):
        return rows, {}
    figures = {"memory_state_spectra": spectra_figure(rows, inp.cfg.task.num_kv_pairs)}
    if any("key_interference" in r for r in rows["layers"].values()):
        figures["memory_state_interference"] = _interference_figure(rows)
    return rows, figures


probe = Probe(
    run=run,
    applies=lambda cfg: None if cfg.task.name == "mqar" else f"needs an MQAR run, not {cfg.task.name!r}",
    description="each layer's final matrix state: singular values, effective rank, and its keys' crosstalk",
)
