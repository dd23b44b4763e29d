"""Chapter 14 on a trained memorize model: change one stored fact with a rank-one write.

    python eval.py run=<memorize run> 'probes=[rank_one_edit]'
    python eval.py run=<memorize run> 'probes=[rank_one_edit]' +options.rank_one_edit.edits=64

The memory is the last block's MLP output matrix W_out (key-major, [hidden,
width]): its keys are the hidden activations h_i of the facts (the `hidden`
intermediate), its values the MLP outputs h_i^T W_out. For a stored fact k*
with key h*, a new value token is drawn and v* (the MLP output that makes the
model predict it) is found by gradient steps on the output at h* alone, as
ROME does. Then two edits write v* at h*, each from the original W_out:

* whitened: W' = W + C^-1 h* (v* - W^T h*)^T / (h*^T C^-1 h*), C = mean h h^T over the facts;
* plain:    W' = W + h* (v* - W^T h*)^T / (h*^T h*).

Both give the same output at h*, so the same edit success; they differ in
how much the other facts move: the whitened edit is the least change in the
keys' own metric. Reported per edit kind: success, facts lost (other facts
stored before and not after), facts that changed prediction, and the RMS
change of the other facts' MLP outputs relative to their size.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from tasks import heldout
from tmem.memory.stores import rank_one_edit
from tmem.mlps import DenseConfig
from tmem.probes.base import Probe, ProbeInput, memorize_alone

DEFAULTS = {"edits": 32, "ridge": 1e-6, "steps": 2000, "lr": 0.05, "p_new": 0.6}


def memory_of(model, batch):
    """(H [F, m] the facts' hidden keys, W [m, width] the last MLP's output matrix, with_kernel(W) -> model)."""
    last = len(model.blocks) - 1
    _, inter = nnx.capture(model, nnx.Intermediate)(batch.inputs)
    H = inter["blocks"][last]["mlp"]["hidden"][0]
    graphdef, state = nnx.split(model)

    def with_kernel(W):
        """A copy of the model whose last W_out is W (the original is left alone)."""
        edited = nnx.merge(graphdef, state, copy=True)
        edited.blocks[last].mlp.w_out.kernel[...] = W
        return edited

    return H.reshape(-1, H.shape[-1]), model.blocks[last].mlp.w_out.kernel[...], with_kernel


def prepare(inp: ProbeInput, o: dict) -> dict:
    """What every edit probe reads off a memorize run: the facts' keys H, the memory W, a predictor
    (W -> each fact's predicted value), which facts are stored, the keys' second moment C (with
    o["ridge"] relative to its trace), the value targets and the facts' tokens."""
    task, model = inp.cfg.task, inp.model
    batch = heldout(task)
    H, W, with_kernel = memory_of(model, batch)
    F = task.num_facts

    @jax.jit
    def predict(W):
        logits = with_kernel(W)(batch.inputs)[..., F:]
        return jnp.argmax(logits, -1).reshape(-1)

    values = np.asarray(batch.targets.reshape(-1) - F)
    before = predict(W)
    C = H.T @ H / H.shape[0]
    C = C + o["ridge"] * jnp.trace(C) / C.shape[0] * jnp.eye(C.shape[0])
    return {"H": H, "W": W, "with_kernel": with_kernel, "predict": predict, "before": np.asarray(before),
            "stored": np.asarray(before) == values, "C": C, "values": values, "inputs": batch.inputs.reshape(-1)}


def pick_edits(key: jax.Array, stored: np.ndarray, values: np.ndarray, n: int, num_values: int):
    """n stored facts drawn at random, each with a new value different from its own: (facts, new values)."""
    k_pick, k_value = jax.random.split(key)
    candidates = np.flatnonzero(stored)
    n = min(int(n), len(candidates))
    picked = np.asarray(jax.random.choice(k_pick, candidates, (n,), replace=False)) if n else np.array([], int)
    shift = np.asarray(jax.random.randint(k_value, (n,), 1, num_values))
    return picked, (values[picked] + shift) % num_values


def value_finder(with_kernel, W: jax.Array, num_facts: int, o: dict):
    """A jitted (h*, token, new value) -> v*: an MLP output at h* under which the model gives the
    new value probability o["p_new"].

    Adam steps (rate o["lr"], at most o["steps"]) on the output at h* alone, stopping
    as soon as p_new is reached, so v* moves no further than the new fact needs.
    """
    F = num_facts

    @jax.jit
    def target_output(h_star, token, new_value):
        u = h_star / (h_star @ h_star)

        def loss(delta):
            logits = with_kernel(W + jnp.outer(u, delta))(token[None, None])[0, 0, F:]
            return optax.softmax_cross_entropy_with_integer_labels(logits, new_value)

        tx = optax.adam(o["lr"])
        stop = -jnp.log(o["p_new"])

        def step(carry):
            delta, opt, i = carry
            upd, opt = tx.update(jax.grad(loss)(delta), opt)
            return optax.apply_updates(delta, upd), opt, i + 1

        def going(carry):
            delta, _, i = carry
            return (i < o["steps"]) & (loss(delta) > stop)

        delta = jnp.zeros(W.shape[1])
        delta, _, _ = jax.lax.while_loop(going, step, (delta, tx.init(delta), 0))
        return h_star @ W + delta

    return target_output


def run(inp: ProbeInput):
    o = {**DEFAULTS, **inp.options}
    task = inp.cfg.task
    m = prepare(inp, o)
    H, W, predict, C, stored, before = m["H"], m["W"], m["predict"], m["C"], m["stored"], m["before"]
    F, values, inputs = task.num_facts, m["values"], m["inputs"]
    key = inp.key if inp.key is not None else jax.random.key(0)
    picked, new_values = pick_edits(key, stored, values, o["edits"], task.num_values)
    n = len(picked)
    target_output = value_finder(m["with_kernel"], W, F, o)

    rows = {"whitened": [], "plain": []}
    base_out = H @ W
    for i, v_new in zip(picked, new_values):
        h_star = H[i]
        v_star = target_output(h_star, inputs[i], jnp.int32(v_new))
        for kind, metric in (("whitened", C), ("plain", None)):
            W2 = rank_one_edit(W, h_star, v_star, metric)
            after = np.asarray(predict(W2))
            others = np.arange(len(values)) != i
            change = np.asarray(H @ W2 - base_out)[others]
            rows[kind].append({
                "success": float(after[i] == v_new),
                "facts_lost": int(np.sum(stored & others & (after != values))),
                "changed": int(np.sum(others & (after != before))),
                "output_change": float(np.sqrt(np.mean(np.sum(change**2, -1)))
                                       / np.sqrt(np.mean(np.sum(np.asarray(base_out)[others] ** 2, -1)))),
            })
    metrics = {"edits": n, "facts": int(F), "stored_before": int(stored.sum())}
    for kind, rs in rows.items():
        metrics[kind] = {k: float(np.mean([r[k] for r in rs])) if rs else None
                         for k in ("success", "facts_lost", "changed", "output_change")}
    return metrics, {"rank_one_edit": _figure(metrics, rows)}


def _figure(metrics, rows):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 3.2))
    axes = fig.subplots(1, 2)
    kinds = list(rows)
    for ax, key, label in ((axes[0], "facts_lost", "other facts lost per edit"),
                           (axes[1], "output_change", "RMS change of other outputs (relative)")):
        data = [[r[key] for r in rows[k]] for k in kinds]
        ax.boxplot(data, tick_labels=[f"{k}\nsuccess {metrics[k]['success']:.2f}" for k in kinds])
        ax.set_title(label, fontsize=9)
    fig.suptitle(f"rank-one edits of {metrics['edits']} stored facts ({metrics['stored_before']} of "
                 f"{metrics['facts']} stored)", fontsize=10)
    fig.tight_layout()
    return fig


def applies(cfg) -> str | None:
    if cfg.task.name == "memorize" and cfg.mlp.name == "none":
        return "the model has no MLP to edit"
    if cfg.task.name == "memorize" and not isinstance(cfg.mlp, DenseConfig):
        return f"edits a dense MLP's output matrix; mlp={cfg.mlp.name} has none"
    return memorize_alone(cfg)


probe = Probe(run=run, applies=applies,
              description="whitened vs plain rank-one edit of one stored fact: success and other facts moved")
