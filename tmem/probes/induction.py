"""Did induction heads form, which heads are they, and when: the `induction` probe.

    python eval.py run=<run dir> 'probes=[induction]'
    python eval.py run=<run dir> 'probes=[induction]' '+options.induction.periods=[8,13,20]'

Per head it reads the prefix-matching (induction), duplicate-token and
previous-token scores on [BOS] + R + R (heads.py), the copying score and
Bietti et al.'s weight-only memory probes (circuits.py); per model the
second-copy against first-copy loss and the in-context-learning score; it
zero-ablates each head, each layer and a control head through the model's
head_mask; and over a run's saved checkpoints it finds the formation step
(formation.py). Definitions and thresholds: anchors/induction.md.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from tasks import heldout
from tmem.config import ConfigError
from tmem.probes.base import Probe, ProbeInput, mixers_without
from tmem.probes.circuits import copying, head_weights, memory_recall
from tmem.probes.composition import composition_figure, composition_scores, pair_series
from tmem.probes.formation import formation, formation_figure
from tmem.probes.heads import forward_with_attention, head_scores, repeated_tokens, token_losses
from tmem.probes.induction_figures import attention_figure

DEFAULTS = {"periods": [10, 20], "batch": 64, "threshold": 0.4, "candidate": 0.2, "formation": True,
            "icl_examples": 256}


def probe_inputs(key: jax.Array, vocab: int, max_len: int, periods, batch: int) -> dict[int, jax.Array]:
    """{period: [BOS] + R + R}, one fixed key per period; raises ConfigError for periods that do not fit."""
    if len(periods) < 2:
        raise ConfigError("options.induction.periods: name at least two periods (one lets a positional head pass)")
    for L in periods:
        if not (2 <= L <= vocab - 1 and 2 * L + 1 <= max_len):
            raise ConfigError(f"options.induction.periods: period {L} needs 2 <= L <= vocab - 1 = {vocab - 1} "
                              f"and 2L + 1 <= seq_len = {max_len}")
    return {int(L): repeated_tokens(jax.random.fold_in(key, int(L)), batch, vocab, int(L)) for L in periods}


def measure(model, probes: dict) -> dict:
    """Everything per head that formation tracks: attention scores, copy losses, memory recall,
    and with two layers or more the K-composition of layer 0 into layer 1."""
    w = head_weights(model)
    k = {"k_composition": composition_scores(w)["K"]} if len(model.blocks) >= 2 else {}
    return {**head_scores(model, probes), **memory_recall(w), **k}


def _heads(mask: np.ndarray) -> list[list[int]]:
    return [[int(layer), int(h)] for layer, h in zip(*np.nonzero(mask))]


def _sorted(heads: list[list[int]], score: np.ndarray) -> list[list[int]]:
    return sorted(heads, key=lambda lh: -score[lh[0], lh[1]])


def classify(scores: dict, positivity: np.ndarray, threshold: float = 0.4, candidate: float = 0.2) -> dict:
    """Induction heads: prefix matching >= threshold in every period, more than duplicate-token
    attention (not a duplicate head) and a copying OV circuit (not an anti-induction head).
    Candidates: mean prefix matching >= `candidate` without passing. Previous-token heads:
    previous-token score >= threshold. Each list is sorted by its score, highest first."""
    ind = scores["induction"]
    worst = np.min([s["induction"] for s in scores["by_period"].values()], axis=0)
    is_ind = (worst >= threshold) & (ind > scores["duplicate"]) & (positivity > 0)
    return {
        "induction_heads": _sorted(_heads(is_ind), ind),
        "candidate_induction_heads": _sorted(_heads((ind >= candidate) & ~is_ind), ind),
        "previous_token_heads": _sorted(_heads(scores["previous_token"] >= threshold), scores["previous_token"]),
    }


def icl_score(model, batch, n: int) -> dict:
    """Late-position loss minus early-position loss on the task's held-out sequences (Olsson et al.),
    adapted to short contexts: positions >= 0.8 T against [0.1 T, 0.2 T). Negative means in-context learning."""
    tokens = batch.inputs[:n]
    logits, _ = forward_with_attention(model, tokens)
    ce = np.asarray(token_losses(logits, tokens)).mean(0)  # by position t, predicting t + 1
    T = tokens.shape[1]
    early, late = ce[int(0.1 * T):max(int(0.2 * T), int(0.1 * T) + 1)], ce[int(0.8 * T):]
    return {"icl_score": float(late.mean() - early.mean()), "icl_early_loss": float(early.mean()),
            "icl_late_loss": float(late.mean())}


def pick_control(scores: dict, roles: dict) -> list[int] | None:
    """The head no probe implicates with the lowest scores, or None when every head has a role."""
    taken = {tuple(h) for k in ("induction_heads", "candidate_induction_heads", "previous_token_heads")
             for h in roles[k]}
    level = np.maximum(np.maximum(scores["induction"], scores["previous_token"]), scores["duplicate"])
    free = [(level[lh], lh) for lh in np.ndindex(level.shape) if lh not in taken]
    return None if not free else [int(x) for x in min(free)[1]]


def ablation(model, probes: dict, target: list[int], roles: dict, control: list[int] | None) -> dict:
    """Zero-ablate each head, each layer, the previous-token heads below the target and the control;
    report the target head's induction score and the second-copy loss against the clean model."""
    depth, H = len(model.blocks), model.blocks[0].mixer.heads
    ones = jnp.ones((depth, H), jnp.float32)

    def read(mask):
        s = head_scores(model, probes, mask)
        return float(s["induction"][target[0], target[1]]), float(s["second_copy_loss"])

    clean_score, clean_loss = read(ones)
    cases = [(f"L{layer}H{h}", "head", [[layer, h]]) for layer in range(depth) for h in range(H)]
    cases += [(f"layer {layer}", "layer", [[layer, h] for h in range(H)]) for layer in range(depth)]
    below = [lh for lh in roles["previous_token_heads"] if lh[0] < target[0]]
    if below:
        cases.append(("previous-token heads", "previous_token_heads", below))
    if control is not None:
        cases.append((f"control L{control[0]}H{control[1]}", "control", [control]))
    rows = []
    for name, kind, heads in cases:
        mask = ones
        for layer, h in heads:
            mask = mask.at[layer, h].set(0.0)
        score, loss = read(mask)
        rows.append({"ablated": name, "kind": kind, "heads": heads, "induction_score": score,
                     "induction_score_change": score - clean_score,
                     "induction_score_relative_change": (score - clean_score) / max(clean_score, 1e-9),
                     "second_copy_loss": loss, "second_copy_loss_change": loss - clean_loss})
    find = lambda kind, name=None: next((r for r in rows if r["kind"] == kind  # noqa: E731
                                         and (name is None or r["ablated"] == name)), None)
    lower = find("layer", f"layer {target[0] - 1}") if target[0] >= 1 else None
    prev, ctrl = find("previous_token_heads"), find("control")
    summary = {
        "target_head": target, "clean_induction_score": clean_score, "clean_second_copy_loss": clean_loss,
        "previous_token_heads_ablated": below,
        "previous_token_ablation_relative_drop": None if prev is None else -prev["induction_score_relative_change"],
        "lower_layer_ablation_relative_drop": None if lower is None else -lower["induction_score_relative_change"],
        "control_head": control,
        "control_second_copy_loss_change": None if ctrl is None else ctrl["second_copy_loss_change"],
    }
    return {"rows": rows, "summary": summary}


def _table(a: np.ndarray) -> list:
    """[depth, H] array -> nested lists, NaN (undefined) as None."""
    return [[None if math.isnan(float(x)) else round(float(x), 6) for x in row] for row in np.asarray(a)]


def verdict(roles: dict, scores: dict, summary: dict, threshold: float) -> tuple[bool, str]:
    """Formed when an induction head exists and knocking out what feeds it (its previous-token
    heads or the whole layer below) at least halves its score: the causal half of the claim."""
    best = np.unravel_index(np.argmax(scores["induction"]), scores["induction"].shape)
    best_score = float(scores["induction"][best])
    if not roles["induction_heads"]:
        depth = scores["induction"].shape[0]
        why = " (a 1-layer model has no layer below to build one with)" if depth == 1 else ""
        return False, (f"no induction heads: the best head L{best[0]}H{best[1]} scores {best_score:.2f} "
                       f"< {threshold} on prefix matching{why}")
    drops = [d for d in (summary["previous_token_ablation_relative_drop"],
                         summary["lower_layer_ablation_relative_drop"]) if d is not None]
    names = ", ".join(f"L{layer}H{h}" for layer, h in roles["induction_heads"])
    prev = ", ".join(f"L{layer}H{h}" for layer, h in roles["previous_token_heads"]) or "none"
    if not drops or max(drops) < 0.5:
        return False, (f"induction-like heads {names} (score {best_score:.2f}), but ablating the layer below "
                       "does not halve their score, so they are not composed with a previous-token head")
    return True, (f"induction heads formed: {names} (best score {best_score:.2f}); previous-token heads: {prev}; "
                  f"ablating what feeds them cuts the score by {max(drops):.0%}")


def analyse(model, task, key: jax.Array, options: dict | None = None) -> tuple[dict, dict]:
    """The probe at one checkpoint: (report dict, internals for figures and notebooks)."""
    opt = {**DEFAULTS, **(options or {})}
    probes = probe_inputs(key, task.vocab_size, task.seq_len, list(opt["periods"]), int(opt["batch"]))
    scores = head_scores(model, probes)
    w = head_weights(model)
    copy, memory = copying(w), memory_recall(w)
    roles = classify(scores, copy["positivity"], opt["threshold"], opt["candidate"])
    target = [int(x) for x in np.unravel_index(np.argmax(scores["induction"]), scores["induction"].shape)]
    if roles["induction_heads"]:
        target = roles["induction_heads"][0]
    control = pick_control(scores, roles)
    abl = ablation(model, probes, target, roles, control)
    formed, text = verdict(roles, scores, abl["summary"], opt["threshold"])
    report = {
        "formed": formed,
        "verdict": text,
        **roles,
        "periods": sorted(probes),
        "threshold": opt["threshold"],
        "heads": {
            "induction": _table(scores["induction"]),
            "induction_by_period": {str(L): _table(s["induction"]) for L, s in scores["by_period"].items()},
            "duplicate": _table(scores["duplicate"]),
            "previous_token": _table(scores["previous_token"]),
            "copying_positivity": _table(copy["positivity"]),
            "copying_top1": _table(copy["top1"]),
        },
        "memory": {k: _table(v) for k, v in memory.items()},
        # [layer-0 head, layer-1 head]: Elhage et al.'s K-, Q- and V-composition (composition.py)
        "composition": None if len(model.blocks) < 2 else {k: _table(v) for k, v in composition_scores(w).items()},
        "first_copy_loss": float(scores["first_copy_loss"]),
        "second_copy_loss": float(scores["second_copy_loss"]),
        "log_vocab": float(np.log(task.vocab_size)),
        **icl_score(model, jax.jit(lambda: heldout(task))(), int(opt["icl_examples"])),
        "ablation": abl["rows"],
        "ablation_summary": abl["summary"],
    }
    return report, {"probes": probes, "scores": scores, "roles": roles, "target": target}


def formation_over_run(history, probes: dict, threshold: float = DEFAULTS["threshold"]) -> dict:
    """The formation series and steps over every saved checkpoint of a run's History (see formation.py)."""
    return formation(history.models(), lambda m: measure(m, probes),
                     held_out_loss=lambda step: history.metrics(step).get("eval/loss"), threshold=threshold)


def run(inp: ProbeInput):
    opt = {**DEFAULTS, **inp.options}
    report, found = analyse(inp.model, inp.cfg.task, inp.key, opt)
    figures = {"induction_attention": attention_figure(inp.model, found)}
    steps = [] if inp.history is None else inp.history.steps
    report["formation_step"] = None
    if opt["formation"] and len(steps) >= 2:
        f = formation_over_run(inp.history, found["probes"], opt["threshold"])
        report["formation"] = f
        report["formation_step"] = f["formation_step"]
        report["loss_drop_step"] = f["loss_drop_step"]
        figures["induction_formation"] = formation_figure(f)
        if len(inp.model.blocks) >= 2:
            k = pair_series(f["k_composition"], report["previous_token_heads"], report["induction_heads"])
            f["k_composition_previous_to_induction"] = k
            figures["induction_composition"] = composition_figure(f["steps"], k, f["formation_step"])
    return report, figures


def _applies(cfg) -> str | None:
    if cfg.task.input_kind != "tokens":
        return f"needs a token task (it feeds repeated random tokens), not {cfg.task.name!r}"
    if others := mixers_without(cfg, lambda m: m.attention_patterns):  # it indexes [layer, head] of every layer
        return f"needs softmax attention in every layer (its patterns are what it scores), not mixer {others!r}"
    return None


probe = Probe(
    run=run,
    applies=_applies,
    description="induction and previous-token heads, copying, memory recall, ablations, formation step",
)
