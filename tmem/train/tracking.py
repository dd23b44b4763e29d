"""Run tracking with wandb: offline by default, so no account or network is needed."""

from __future__ import annotations

import os
from pathlib import Path

import wandb

from tmem.config import LoggerConfig


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
