"""Chapter 5's open question on a trained slow memory: which measurable property of its MLP goes with how many facts
it holds.

    python eval.py run=<memorize run> 'probes=[mlp_keys]'

The MLP's memories are its hidden units: unit j's key is row j of W_in^T (the
direction it detects in the normalised input), its value row j of W_out.
Measured on the last block's dense MLP of a memorize run, over the facts
themselves (each fact's key token once):

* key_rank: effective rank of the m keys (at most the width d), the number of
  input directions they span;
* key_coherence, key_coherence_max: the mean and largest |cos| between two
  distinct keys, how much the detectors overlap (Chapter 3's interference);
* code_rank: effective rank of the facts' hidden code H [facts, m], how many
  independent directions the read W_out can tell the facts apart by;
* code_units: per fact, the participation ratio (sum |h|)^2 / sum h^2 of its
  code, the units that carry it (a sparse code uses few), averaged;
* bias_spread: the std of W_in's biases over the keys' mean norm, the spread of
  the units' thresholds (0 without biases, tmem's default);
* facts_stored: facts whose argmax over the value tokens is right.

`tmem.sweeps.mlp_capacity` fits facts stored against each property across runs.
"""

from __future__ import annotations

import numpy as np

from tmem.mlps.dense import GATED
from tmem.probes import rank_one_edit
from tmem.probes.base import Probe, ProbeInput
from tmem.probes.memory_state import effective_rank


def coherence(keys: np.ndarray) -> tuple[float, float]:
    """(mean, max) |cos| between distinct rows of `keys` [m, d]; rows of zero norm count as orthogonal."""
    keys = np.asarray(keys, np.float64)
    norms = np.linalg.norm(keys, axis=1, keepdims=True)
    unit = np.divide(keys, norms, out=np.zeros_like(keys), where=norms > 0)
    cos = np.abs(unit @ unit.T)[~np.eye(len(keys), dtype=bool)]
    return (float(cos.mean()), float(cos.max())) if cos.size else (0.0, 0.0)


def participation(code: np.ndarray) -> np.ndarray:
    """(sum |h|)^2 / sum h^2 per row of `code` [n, m]: k equal entries and zeros give k; a zero row gives 0."""
    a = np.abs(np.asarray(code, np.float64))
    squares = np.sum(a * a, axis=-1)
    return np.divide(np.sum(a, axis=-1) ** 2, squares, out=np.zeros_like(squares), where=squares > 0)


def properties(w_in: np.ndarray, hidden: np.ndarray, bias: np.ndarray | None = None) -> dict[str, float]:
    """The candidate predictors of a dense MLP from W_in [d, m] (keys are its columns), the facts' hidden code
    [facts, m] and W_in's bias [m] (None: no biases)."""
    keys = np.asarray(w_in, np.float64).T
    mean_cos, max_cos = coherence(keys)
    key_norm = float(np.linalg.norm(keys, axis=1).mean())
    spread = 0.0 if bias is None or key_norm == 0 else float(np.std(np.asarray(bias, np.float64)) / key_norm)
    return {"key_rank": float(effective_rank(np.linalg.svd(keys, compute_uv=False))),
            "key_coherence": mean_cos, "key_coherence_max": max_cos,
            "code_rank": float(effective_rank(np.linalg.svd(np.asarray(hidden, np.float64), compute_uv=False))),
            "code_units": float(participation(hidden).mean()), "bias_spread": spread, "hidden": keys.shape[0]}


def run(inp: ProbeInput) -> tuple[dict, dict]:
    mlp = inp.model.blocks[len(inp.model.blocks) - 1].mlp
    facts = rank_one_edit.prepare(inp, {"ridge": 0.0})
    bias = getattr(mlp.w_in, "bias", None)
    metrics = properties(np.asarray(mlp.w_in.kernel[...]), np.asarray(facts["H"]),
                         None if bias is None else np.asarray(bias[...]))
    return {**metrics, "facts": int(inp.cfg.task.num_facts), "facts_stored": int(facts["stored"].sum())}, {}


def applies(cfg) -> str | None:
    """A memorize run's dense MLP without a mixer, as the rank-one edit reads it, with one key per unit."""
    if reason := rank_one_edit.applies(cfg):
        return reason
    if cfg.mlp.name in GATED:
        return f"reads one key per hidden unit; mlp={cfg.mlp.name} gates each unit with a second one"
    return None


probe = Probe(run=run, applies=applies,
              description="a memorize run's MLP: effective rank and overlaps of its keys, rank of its code, facts")
