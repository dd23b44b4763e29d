"""Which probe reads which run: a pure function over the registries, tested over the whole matrix, and each
applicable probe run once per row family.

`Probe.applies(cfg)` is asked of every probe in PROBES, for every row in
configs/mixer/ on every task in configs/task/ that the row can read, so a
new row, task or probe joins the matrix by existing. It must return None or a
one-line reason, and never raise: eval.py asks it before anything loads.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from conftest import compose_config, untrained_run
from tmem.config import CONFIG_DIR, resolve_auto, validate
from tmem.probes import PROBES

ROWS = sorted(p.stem for p in (CONFIG_DIR / "mixer").glob("*.yaml"))
TASK_NAMES = sorted(p.stem for p in (CONFIG_DIR / "task").glob("*.yaml"))


def switched(cfg) -> list:
    """The config as it is and with the model switches some probes ask for: no norm with an MLP (a memory to
    edit), and a vector task's tokens read in as they are."""
    plain = dataclasses.replace(cfg.model, norm="none", read_in="identity", positions="none")
    return [cfg, dataclasses.replace(cfg, model=plain, mlp=dataclasses.replace(cfg.mlp, name="relu"))]


def pairs():
    """Every row on every task, as validation makes them (the row fitted to the task, the model's auto settings
    resolved), where the row can read the task; each validated once alone, since validating every pair would
    take minutes."""
    rows = {row: validate(compose_config([f"mixer={row}"])) for row in ROWS}
    tasks = {task: validate(compose_config([f"task={task}"])).task for task in TASK_NAMES}
    for row, cfg in rows.items():
        for name, task in tasks.items():
            try:
                mixer = cfg.mixer.fit(task, cfg.model.width)
            except ValueError:  # the row cannot read this task (validation refuses the pair in one line)
                continue
            model = resolve_auto(dataclasses.replace(cfg.model, positions="auto", read_in="auto"), (mixer,), task)
            yield from ((row, name, c) for c in switched(dataclasses.replace(cfg, task=task, mixer=mixer,
                                                                             model=model)))


@pytest.mark.slow  # about 15 s: a composition and a validation of every row and every task
def test_every_probe_says_whether_it_reads_every_row_on_every_task():
    answered = {name: {"applies": 0, "refused": 0} for name in PROBES}
    for row, task, cfg in pairs():
        for name, probe in PROBES.items():
            why = probe.applies(cfg)  # never raises
            assert why is None or (isinstance(why, str) and why and "\n" not in why), (name, row, task, why)
            answered[name]["applies" if why is None else "refused"] += 1
    # every probe reads some pair, and every one that needs a run refuses another (heldout reads any run)
    for name, counts in answered.items():
        assert counts["applies"] > 0, name
        assert counts["refused"] > 0 or not PROBES[name].needs_run or name == "heldout", name


# One tiny untrained run per row family (a layer class; the regression grid's cells resolve to these) on the task
# its probes read (MQAR for most, induction's included; the in-context regression for gd_match, memorize for
# rank_one_edit), each probe that applies run once on it
FAMILIES = {
    "softmax": ["mixer=softmax", "mixer.kv_heads=1"],
    "hopfield": ["mixer=hopfield"],
    "fast_weight": ["mixer=gated_deltanet"],
    "mesa": ["mixer=mesa"],
    "ttt": ["mixer=ttt_mlp"],
    "titans": ["mixer=titans"],
    "lsa": ["experiment=icl_gd", "task.dim=4", "task.num_examples=8"],
    "none": ["task=memorize", "mixer=none", "mlp=relu", "task.num_facts=32", "task.num_values=4"],
}
SMALL = ["model.width=16", "model.depth=1", "train.batch_size=16", "train.steps=3", "train.log_every=1",
         "train.eval_every=3", "train.checkpoint_every=3", "optim.warmup_steps=1", "logger=disabled",
         "train.diverge_factor=null"]
SMALL_TASK = {"mqar": ["task.vocab=32", "task.seq_len=16", "task.num_kv_pairs=2", "task.heldout_size=64"],
              "linreg": ["task.heldout_size=64", "model.width=5"], "memorize": []}
OPTIONS = {"induction": {"periods": [4, 7], "batch": 8, "icl_examples": 16}, "memory_state": {"sequences": 16},
           "gd_match": {"fit_tasks": 128, "gdpp_fit_tasks": 64, "max_steps": 1, "ood_scales": [1.0]},
           "rank_one_edit": {"edits": 4, "steps": 50}, "dilution": {"pairs": [0, 2]}, "keys_move": {"batch": 4},
           "rephrasing": {"radii": [0.0, 0.5], "draws": 2}, "learned_keys": {"sequences": 16, "chunk": 16},
           "diffusion": {"examples": 8}, "saturation": {"examples": 8}}


def finite_numbers(tree) -> list[float]:
    if isinstance(tree, dict):
        return [x for v in tree.values() for x in finite_numbers(v)]
    if isinstance(tree, list):
        return [x for v in tree for x in finite_numbers(v)]
    return [tree] if isinstance(tree, (int, float)) and not isinstance(tree, bool) and math.isfinite(tree) else []


@pytest.mark.slow  # about a minute: eight untrained runs and their probes
@pytest.mark.parametrize("family", FAMILIES)
def test_each_probe_that_applies_runs_on_a_tiny_run_of_each_row_family(family, tmp_path):
    from tmem.train.evaluate import evaluate

    task = compose_config(FAMILIES[family]).task.name  # its task's own small sizes follow
    composed = compose_config([*FAMILIES[family], *SMALL, *SMALL_TASK[task]])
    cfg = validate(composed)
    # the untrained state where the 3-step run saves its checkpoint: the probes read weights of any training (the
    # loss and gradients of every row are compiled by tests/test_golden.py, and trained runs by the probes' own tests)
    untrained_run(tmp_path / "run", composed, step=cfg.train.steps)
    probes = [name for name, p in PROBES.items() if p.needs_run and p.applies(cfg) is None]
    assert probes, family
    report = evaluate(str(tmp_path / "run"), probes, out_dir=tmp_path / "eval",
                      options={k: v for k, v in OPTIONS.items() if k in probes})
    json.dumps(report)  # what eval.py writes
    for name in probes:
        assert finite_numbers(report[name]), (family, name, report[name])
