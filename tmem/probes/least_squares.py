"""How close is a trained fast-weight memory to the least-squares memory of what it wrote? (the note, Chapters 4
and 10: the delta rule is one step of gradient descent on the recall error of the newest pair, recursive least
squares the exact solve over all of them.)

Over held-out MQAR sequences the probe runs the trained model on the context (the kv pairs), reads each layer's
keys, values, decays and write strengths as it wrote them (the `keys` and `writes` intermediates) and its state
after the context, and builds from the same keys and values the memories of Chapter 4:

* `least_squares`: argmin_S sum_t ||S^T k_t - v_t||^2, the minimum-norm one where the keys do not fix it;
* `ridge` at each lambda: the same plus lambda ||S||_F^2;
* `weighted_ridge` at each lambda (and `weighted_least_squares`, lambda 0): every token's error weighted by
  gamma_t = beta_t prod_{s>t} a_s, its own write strength times the decay it received after it was written,
  the objective a gated delta rule's write steps on (recursive least squares with the layer's forgetting);
* `hebbian`: sum_t gamma_t k_t v_t^T, the add rule's memory over the same writes (the unwhitened store).

For each it reports the relative distance ||S - S*||_F / ||S*||_F of the layer's state S and the cosine between
the two (the read is RMS-normalised in these rows, so a state's scale is not what it recalls by), and the
recall each gives from the same queries: the model continued over the query region from the context's states
with every matrix layer's state replaced by that memory (`MixerState.with_matrix`), its MQAR accuracy beside
the trained state's own (`state`, the model's accuracy: the continuation's check). A mesa layer's state is
its sums; its read matrix (H + Lambda)^-1 G is what is compared, its exact solve at the same keys.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from flax import nnx

from tmem.mixers.base import NoMatrix
from tmem.mixers import layer_of
from tmem.probes.base import Probe, ProbeInput, mixers_without
from tmem.probes.memory_state import captured, heldout_pairs

# pair_counts: held-out sets of these numbers of pairs (None: the trained task's), each lengthened to fit them
DEFAULTS = {"sequences": 256, "chunk": 128, "ridges": [0.01, 0.1, 1.0], "pair_counts": None}


# ---- the memories (pure) ----

def pair_weights(log_a: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """gamma_t = beta_t prod_{s>t} a_s over the last (time) axis: the weight a write of strength beta_t keeps
    under the decays a_s = exp(log_a_s) of the tokens after it."""
    log_a = np.asarray(log_a, np.float64)
    after = np.cumsum(log_a[..., ::-1], -1)[..., ::-1] - log_a  # sum_{s>t} log a_s
    return np.asarray(beta, np.float64) * np.exp(after)


def ridge_memory(keys, values, weights=None, ridge: float = 0.0) -> np.ndarray:
    """argmin_S sum_t w_t ||S^T k_t - v_t||^2 + ridge ||S||_F^2, key-major [..., d_k, d_v], from keys
    [..., n, d_k], values [..., n, d_v] and weights [..., n] (None: all 1). ridge 0 is least squares, the
    minimum-norm solution where the weighted keys span fewer than d_k directions."""
    K, V = np.asarray(keys, np.float64), np.asarray(values, np.float64)
    w = np.ones(K.shape[:-1]) if weights is None else np.asarray(weights, np.float64)
    if ridge == 0:
        root = np.sqrt(w)[..., None]
        return np.linalg.pinv(root * K, rcond=1e-10) @ (root * V)
    gram = np.swapaxes(K, -1, -2) @ (w[..., None] * K) + ridge * np.eye(K.shape[-1])
    return np.linalg.solve(gram, np.swapaxes(K, -1, -2) @ (w[..., None] * V))


def hebbian_memory(keys, values, weights=None) -> np.ndarray:
    """sum_t w_t k_t v_t^T, key-major [..., d_k, d_v]: the add rule's memory of the same writes."""
    K, V = np.asarray(keys, np.float64), np.asarray(values, np.float64)
    w = np.ones(K.shape[:-1]) if weights is None else np.asarray(weights, np.float64)
    return np.swapaxes(K, -1, -2) @ (w[..., None] * V)


def _frobenius(a, b):
    return np.sum(a * b, axis=(-2, -1))


def relative_distance(S, reference) -> np.ndarray:
    """||S - S*||_F / ||S*||_F over the last two axes."""
    S, reference = np.asarray(S, np.float64), np.asarray(reference, np.float64)
    return np.sqrt(_frobenius(S - reference, S - reference) / _frobenius(reference, reference))


def matrix_cosine(S, reference) -> np.ndarray:
    """<S, S*>_F / (||S||_F ||S*||_F) over the last two axes: 1 when S is S* at any positive scale."""
    S, reference = np.asarray(S, np.float64), np.asarray(reference, np.float64)
    return _frobenius(S, reference) / np.sqrt(_frobenius(S, S) * _frobenius(reference, reference))


def memories(keys, values, log_a, beta, ridges) -> dict[str, np.ndarray]:
    """Every reference memory of one layer's writes: keys [..., n, d_k], values [..., n, d_v], log_a and beta
    [..., n] (a scalar decay per token)."""
    gamma = pair_weights(log_a, beta)
    found = {"least_squares": ridge_memory(keys, values), "weighted_least_squares": ridge_memory(keys, values, gamma),
             "hebbian": hebbian_memory(keys, values, gamma)}
    for lam in ridges:
        found[f"ridge_{lam:g}"] = ridge_memory(keys, values, ridge=lam)
        found[f"weighted_ridge_{lam:g}"] = ridge_memory(keys, values, gamma, lam)
    return found


# ---- the probe ----

def _per_head(x):
    """[B, T, H, ...] -> [B, H, T, ...] in float64."""
    return np.moveaxis(np.asarray(x, np.float64), 2, 1)


def _layer_memories(layer, state, sown, ridges) -> tuple[np.ndarray, dict[str, np.ndarray]] | str:
    """A layer's read matrix after the context [B, H, d_k, d_v] and its reference memories, or why there are none."""
    if "writes" not in sown or "keys" not in sown:
        return f"{type(layer).__name__} does not sow its writes"
    values, log_a, beta = sown["writes"]
    if log_a.shape[-1] != 1:
        return "a decay per key channel weighs no pair as a whole: no weighted regression is its objective"
    try:
        S = np.asarray(state.read_matrix(layer), np.float64)
    except NoMatrix as e:
        return f"no matrix state: {e}"
    return S, memories(_per_head(sown["keys"]), _per_head(values), _per_head(log_a)[..., 0], _per_head(beta), ridges)


@functools.partial(jax.jit, static_argnums=0)
def _continued(graphdef, params, tokens, states, positions):
    """The logits at `positions` of the model continuing from `states` over `tokens`."""
    return nnx.merge(graphdef, params).forward(tokens, positions=positions, states=states)[0]


def least_squares(model, batch, task, ridges=DEFAULTS["ridges"], chunk: int = 128) -> dict:
    """The report over held-out MQAR sequences (`batch`: inputs [N, T], positions, targets and mask [N, Q])."""
    context = 2 * task.num_kv_pairs * task.num_passes
    graphdef, params = nnx.split(model)
    sums, correct, layers, N = {}, {}, {}, batch.inputs.shape[0]
    scored = np.asarray(batch.mask) > 0
    for start in range(0, N, chunk):
        part = slice(start, start + chunk)
        states, sown = captured(model, batch.inputs[part, :context], ("keys", "writes"))
        found = {}
        for i, (state, s) in enumerate(zip(states, sown)):
            layer = model.blocks[i % len(model.blocks)].mixer
            result = _layer_memories(layer, state, s, ridges)
            if isinstance(result, str):
                layers[str(i)] = {"mixer": type(layer).__name__, "compared": False, "reason": result}
                continue
            S, refs = result
            found[i] = refs
            layers[str(i)] = {"mixer": type(layer).__name__, "compared": True, "d_key": int(S.shape[-2])}
            for name, ref in refs.items():
                for measure, f in (("distance", relative_distance), ("cosine", matrix_cosine)):
                    key = (i, name, measure)
                    sums[key] = sums.get(key, 0.0) + f(S, ref).sum(0)  # per head
        for variant in ("state", *next(iter(found.values()), {})):
            try:  # every compared layer's state replaced at once; "state" keeps the trained ones
                replaced = [state if i not in found or variant == "state" else
                            state.with_matrix(model.blocks[i % len(model.blocks)].mixer, found[i][variant])
                            for i, state in enumerate(states)]
            except NoMatrix:
                continue  # a read that is no matrix (mesa's solve): distances only
            logits = _continued(graphdef, params, batch.inputs[part, context:], replaced,
                                batch.positions[part] - context)
            hit = np.argmax(np.asarray(logits), -1) == np.asarray(batch.targets[part])
            correct.setdefault(variant, []).append(hit[scored[part]])
    for (i, name, measure), total in sums.items():
        per_head = total / N
        layers[str(i)].setdefault(measure, {})[name] = per_head.tolist()
        layers[str(i)].setdefault(f"mean_{measure}", {})[name] = float(per_head.mean())
    recall = {variant: float(np.concatenate(c).mean()) for variant, c in correct.items()}
    return {"sequences": int(N), "pairs": task.num_kv_pairs, "writes": context, "ridges": list(ridges),
            "layers": layers, "recall": recall}


def figure(report: dict):
    """Each compared layer's mean relative distance and cosine to every reference memory, and the recall each
    memory gives in place of the trained states."""
    from matplotlib.figure import Figure

    compared = {i: r for i, r in report["layers"].items() if r["compared"]}
    names = list(next(iter(compared.values()))["mean_distance"])
    fig = Figure(figsize=(11, 3.4))
    axes = fig.subplots(1, 3)
    y = np.arange(len(names))
    for j, (i, r) in enumerate(compared.items()):
        height = 0.8 / len(compared)
        for ax, measure in zip(axes[:2], ("distance", "cosine")):
            ax.barh(y + j * height, [r[f"mean_{measure}"][n] for n in names], height, label=f"layer {i}")
    recall = report["recall"]
    axes[2].barh(np.arange(len(recall)), list(recall.values()), color="C2")
    axes[2].set_yticks(np.arange(len(recall)), list(recall), fontsize=7)
    for ax, title in zip(axes[:2], ("||S - S*|| / ||S*||", "cos(S, S*)")):
        ax.set_yticks(y + 0.4 - 0.4 / len(compared), names, fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    axes[2].set(xlim=(0, 1.02), title="MQAR accuracy with S replaced")
    fig.suptitle(f"the state after {report['writes']} writes ({report['pairs']} pairs) against least squares",
                 fontsize=9)
    fig.tight_layout()
    return fig


def pairs_figure(by_pairs: dict, shown=("least_squares", "weighted_ridge_0.1", "hebbian")):
    """Against the writes per key dimension (2 pairs' tokens / d_k): the cosine of the state to each memory in
    `shown` (mean over compared layers), and the recall each gives in place of the trained states."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 3.2))
    axes = fig.subplots(1, 2)
    reports = sorted(by_pairs.values(), key=lambda r: r["pairs"])
    layers = [[r for r in rep["layers"].values() if r["compared"]] for rep in reports]
    x = [rep["writes"] / ls[0]["d_key"] for rep, ls in zip(reports, layers)]
    for name in shown:
        if name in layers[0][0]["mean_cosine"]:
            axes[0].plot(x, [np.mean([r["mean_cosine"][name] for r in ls]) for ls in layers], "o-", label=name)
    for name in ("state", *shown):
        if name in reports[0]["recall"]:
            axes[1].plot(x, [rep["recall"][name] for rep in reports], "o-", label=name)
    axes[0].set(xlabel="writes / d_k", ylabel="cos(S, S*)", ylim=(0, 1.02), title="state against each memory")
    axes[1].set(xlabel="writes / d_k", ylabel="MQAR accuracy", ylim=(0, 1.02), title="S replaced by each memory")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def run(inp: ProbeInput):
    """The trained task's held-out set, or (options.least_squares.pair_counts) one per number of pairs, each as
    long as its pairs need."""
    o = {**DEFAULTS, **inp.options}
    ridges, task = [float(r) for r in o["ridges"]], inp.cfg.task
    counts = o["pair_counts"] or [task.num_kv_pairs]
    by_pairs = {}
    for pairs in counts:
        at, batch = heldout_pairs(task, pairs, o["sequences"])
        by_pairs[str(pairs)] = least_squares(inp.model, batch, at, ridges, o["chunk"])
    first = next(iter(by_pairs.values()))
    if not any(r["compared"] for r in first["layers"].values()):
        return first, {}
    if not o["pair_counts"]:
        return first, {"least_squares": figure(first)}
    figures = {f"least_squares_{p}": figure(r) for p, r in by_pairs.items()}
    return {"by_pairs": by_pairs}, {**figures, "least_squares_by_pairs": pairs_figure(by_pairs)}


def _applies(cfg):
    if cfg.task.name != "mqar":
        return f"needs an MQAR run, not {cfg.task.name!r}"
    if not any("writes" in layer_of(m).sows for m in cfg.layers):  # a hybrid's other layers are reported as such
        return f"needs a layer that sows its writes (a fast-weight row or mesa), not {mixers_without(cfg, lambda m: False)}"
    return None


probe = Probe(
    run=run,
    applies=_applies,
    description="each fast-weight layer's state against the least-squares and ridge memories of its own writes",
)
