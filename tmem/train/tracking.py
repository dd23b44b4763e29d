"""Run tracking with wandb: offline by default, so no account or network is needed."""

from __future__ import annotations

import os
from pathlib import Path

import wandb
from hydra.types import RunMode
from omegaconf import DictConfig

from tmem.schema import LoggerConfig


def sweep_job(hydra_cfg: DictConfig) -> dict | None:
    """A multirun job's place in its sweep, from Hydra's own config of the job; None for a single run.

    The group is named after the sweep directory by its last two parts: the
    date and time of the default multirun/<date>/<time>, or the parent and
    name of a directory given with hydra.sweep.dir (a time alone would repeat
    from one day to the next).
    """
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return None
    sweep_dir = Path(hydra_cfg.sweep.dir).absolute()
    return {"group": "/".join(sweep_dir.parts[-2:]), "sweep_dir": str(sweep_dir), "job": int(hydra_cfg.job.num),
            "overrides": list(hydra_cfg.overrides.task), "override_dirname": str(hydra_cfg.job.override_dirname)}


def group_and_config(name: str, resolved: dict, sweep: dict | None) -> tuple[str, dict]:
    """The wandb group and config of a training run.

    A single run is its own group (its resumes and evaluations join it). Every
    job of a multirun joins its sweep's group and adds its place in the sweep
    (`multirun`: job number, overrides) to the resolved config, so a synced
    sweep is one group whose swept values wandb's parallel-coordinates view can
    plot. The config a checkpoint keeps is `resolved` alone either way.
    """
    if sweep is None:
        return name, resolved
    return sweep["group"], {**resolved, "multirun": {k: v for k, v in sweep.items() if k != "group"}}


class Tracker:
    """One wandb run, its files under `<run dir>/wandb`.

    Offline wandb cannot resume a run, so every later session on a run
    directory (a resume, an evaluation) opens a new wandb run in the same
    group, named after the original; `wandb sync <run dir>/wandb/offline-run-*`
    uploads them all.
    """

    def __init__(self, cfg: LoggerConfig, run_dir: Path, *, name: str, group: str,
                 config: dict, job_type: str = "train"):
        os.environ.setdefault("WANDB_SILENT", "true")
        self.run = wandb.init(
            project=cfg.project, entity=cfg.entity, mode=cfg.mode, dir=str(run_dir),
            name=name, group=cfg.group or group, job_type=job_type, tags=list(cfg.tags),
            config=config, settings=wandb.Settings(console="off"),
        )

    @property
    def directory(self) -> str | None:
        """The run's own files, or None when tracking is disabled."""
        return None if self.run.disabled else str(Path(self.run.dir).parent)

    def log(self, metrics: dict, step: int) -> None:
        self.run.log(metrics, step=step)

    def image(self, key: str, path: Path, step: int | None = None) -> None:
        self.run.log({key: wandb.Image(str(path))}, step=step)

    def summary(self, values: dict) -> None:
        self.run.summary.update(values)

    def finish(self, exit_code: int = 0) -> None:
        self.run.finish(exit_code=exit_code)


def finish_open(exit_code: int) -> None:
    """Finish the wandb run this process has open, if any (a run that stopped on an error before closing its own)."""
    if wandb.run is not None:
        wandb.run.finish(exit_code=exit_code)
