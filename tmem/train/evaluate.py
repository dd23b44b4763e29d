"""The eval frame: restore a run (tmem.train.restore), run probes on it, write the report.

Task overrides (tmem.train.task_overrides) change the task the probes read,
never the model: the run is restored from its own config, and the probes get
the overridden config through ProbeInput.cfg. A report describes one
checkpoint read on one task, so it records the overrides and starts afresh
when either differs from the report already in its folder.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax

from tmem.config import ConfigError
from tmem.probes import PROBES, ProbeInput
from tmem.schema import LoggerConfig
from tmem.train.restore import load_run, saved_run
from tmem.train.task_overrides import spelled, with_task
from tmem.train.tracking import Tracker


def select_probes(names: list[str], cfg) -> list[str]:
    """Check every requested probe exists and applies; raise ConfigError naming the first that does not."""
    if not names:
        raise ConfigError(f"probes: name at least one; allowed: {', '.join(PROBES)}")
    for name in names:
        if name not in PROBES:
            raise ConfigError(f"probes: unknown probe {name!r}; allowed: {', '.join(PROBES)}")
        probe = PROBES[name]
        if probe.needs_run and cfg is None:
            raise ConfigError(f"probe {name!r} needs a trained model: pass run=<run dir>")
        if cfg is not None and (why := probe.applies(cfg)):
            raise ConfigError(f"probe {name!r} does not apply to this run: {why}")
    return names


def check_request(run_dir: str | None, probe_names: list[str], step: int | None = None,
                  task: dict | None = None) -> None:
    """Everything about an eval request that can be checked without restoring a model (eval.py calls it
    before Hydra writes the run's eval folder); ConfigError or CheckpointError in one line."""
    _needs_run(run_dir, task)
    select_probes(probe_names, None if run_dir is None else with_task(saved_run(run_dir, step)[0], task))


def _needs_run(run_dir: str | None, task: dict | None) -> None:
    if task and run_dir is None:
        raise ConfigError(f"{spelled(task)}: task overrides change a trained run's task: pass run=<run dir>")


def evaluate(run_dir: str | None, probe_names: list[str], *, out_dir: Path, step: int | None = None,
             logger: LoggerConfig = LoggerConfig(), seed: int = 0, options: dict | None = None,
             task: dict | None = None) -> dict:
    """Run the probes and write `report.json` and figures to out_dir; return the report.

    task: overrides of the run's task fields (field -> value), read by every probe.
    """
    task = dict(task or {})
    _needs_run(run_dir, task)
    cfg = model = history = None
    if run_dir is not None:
        trained, model, step, history = load_run(run_dir, step)
        cfg = with_task(trained, task)  # the model stays as trained; only what the probes read changes
    select_probes(probe_names, cfg)
    out_dir = Path(out_dir).absolute()
    out_dir.mkdir(parents=True, exist_ok=True)
    report_path = out_dir / "report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    if report.get("step") != step or report.get("task_overrides", {}) != task:
        report = {}  # a report describes one checkpoint read on one task
    report.update(run=None if run_dir is None else str(Path(run_dir).absolute()), step=step, task_overrides=task)
    if cfg is not None:
        report["task"] = {"name": cfg.task.name, **dataclasses.asdict(cfg.task)}

    name = cfg.name or Path(run_dir).absolute().name if cfg else "probes"
    suffix = f"-{spelled(task)}" if task else ""
    tracker = Tracker(logger, Path(run_dir).absolute() if run_dir else out_dir, name=f"{name}-eval-{step}{suffix}",
                      group=name, config={"run": report["run"], "step": step, "probes": probe_names,
                                          "task_overrides": task}, job_type="eval")
    inp = ProbeInput(cfg=cfg, model=model, step=step, key=jax.random.key(seed),
                     run_dir=None if run_dir is None else Path(run_dir).absolute(), history=history)
    figures = {}
    for probe_name in probe_names:
        inp.options = dict((options or {}).get(probe_name, {}))
        metrics, figs = PROBES[probe_name].run(inp)
        report[probe_name] = metrics
        for fig_name, fig in figs.items():
            path = out_dir / f"{fig_name}.png"
            fig.savefig(path, dpi=120)
            figures[fig_name] = str(path)
            tracker.image(f"{probe_name}/{fig_name}", path)
        tracker.log({f"{probe_name}/{k}": v for k, v in _scalars(metrics).items()}, step=None)
    report["figures"] = {**report.get("figures", {}), **figures}
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    tracker.finish()
    return report


def _scalars(tree: dict, prefix: str = "") -> dict[str, float]:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_scalars(v, f"{prefix}{k}/"))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"{prefix}{k}"] = v
    return out
