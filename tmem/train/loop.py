"""The training loop: dispatch jitted steps, evaluate, checkpoint, track, summarise."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import time
from pathlib import Path

import jax
import numpy as np
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from tasks import heldout
from tmem.config import ConfigError
from tmem.model import count_params
from tmem.schema import Config
from tmem.train.build import build, evaluation_graphdef
from tmem.train.checkpoint import CheckpointError, Checkpoints
from tmem.train.cluster import is_primary
from tmem.train.mesh import check_divisible, data_mesh, describe, replicated
from tmem.train.record import MetricsFile
from tmem.train.resolved import hardware_of, run_record, versions_of, write_resolved
from tmem.train.step import chance_loss, make_eval, make_train_step
from tmem.train.tracking import Tracker, group_and_config

PROGRESS_KEYS = ("wall_seconds", "target_step", "target_seconds")
# LLVM's optimisation level for the run's programs on a CPU, against XLA's default 3: at 1 every row's default
# step measured the same or up to 9% shorter and compiled 7 to 26% sooner (BENCHMARKS.md, "LLVM at -O1 on a CPU")
CPU_LLVM_LEVEL = 1
FIX = "Fix: lower optim.lr, raise optim.warmup_steps or set optim.clip_norm."
log = logging.getLogger(__name__)  # the console and, under Hydra, the run's train.log


class TrainingDiverged(RuntimeError):
    """The loss became NaN or Inf; the message names the step and the last good checkpoint."""


@contextlib.contextmanager
def stop_requests():
    """SIGINT/SIGTERM ask the loop to save and stop; a second one stops at once."""
    received: list[int] = []
    previous = {}

    def handler(signum, frame):
        received.append(signum)
        signal.signal(signum, previous[signum])

    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, handler)
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def state_sizes(cfg: Config) -> tuple[int | None, int | None]:
    """Mixer state elements per sequence at the task's length (summed over layers), and per token."""
    width = cfg.model.width
    per_token = [layer.state_size_per_token(width) for layer in cfg.layers]  # a hybrid's layers, each its own
    grows = [n for n in per_token if n is not None]
    return sum(layer.state_size(width, cfg.task.seq_len) for layer in cfg.layers), sum(grows) if grows else None


def run(cfg: Config, run_dir: Path, resolved: dict, sweep: dict | None = None) -> dict:
    """Train the run a config describes in `run_dir`; write and return its summary.

    `sweep` (tmem.train.tracking.sweep_job) makes a multirun's job log into
    its sweep's wandb group, its overrides in the wandb config.
    """
    for name in ("absl", "orbax"):
        logging.getLogger(name).setLevel(logging.WARNING)
    with stop_requests() as stop:
        trainer = Trainer(cfg, Path(run_dir).absolute(), resolved, sweep)
        return trainer.fit(stop)


def data_parallel_step(cfg: Config, graphdef, tx, schedule, mesh):
    """The train step jitted as a run trains it (and the benchmarks time it): the state replicated over `mesh`,
    each device differentiating its share of every batch or slice, the state donated."""
    t, whole = cfg.train, replicated(mesh)
    step = make_train_step(graphdef, cfg.task, tx, t.batch_size, schedule, t.microbatch, mesh,
                           t.compute_dtype)
    return jax.jit(step, donate_argnums=0, in_shardings=whole, out_shardings=whole,
                   compiler_options=compiler_options(mesh))


def compiler_options(mesh) -> dict | None:
    """XLA's options for a run's programs on `mesh`: CPU_LLVM_LEVEL on CPUs, unless XLA_FLAGS sets the level (the
    tests' 0, a user's own); an accelerator's are XLA's."""
    if mesh.devices.flat[0].platform != "cpu" or "xla_backend_optimization_level" in os.environ.get("XLA_FLAGS", ""):
        return None
    return {"xla_backend_optimization_level": CPU_LLVM_LEVEL}


class Trainer:
    """One training session on a run directory (a fresh run or a resumed one).

    It trains on every visible device (`tmem.train.mesh`): the state
    replicated, each batch split along the mesh's `data` axis.
    """

    def __init__(self, cfg: Config, run_dir: Path, resolved: dict, sweep: dict | None = None):
        self.cfg, self.run_dir, t = cfg, run_dir, cfg.train
        task = cfg.task
        self.mesh = data_mesh()
        problem = check_divisible(self.mesh.size, t)
        if problem:  # before anything compiles
            raise ConfigError(problem)
        log.info(describe(self.mesh, t.batch_size))
        self.record = run_record(cfg, hardware_of(self.mesh), versions_of())
        if is_primary():  # before anything compiles: a run that crashes still says what it ran
            run_dir.mkdir(parents=True, exist_ok=True)
            write_resolved(run_dir, self.record)
        whole = replicated(self.mesh)
        built = build(cfg)
        self.n_params = count_params(built.model)
        graphdef, state, tx, self.schedule = built
        self.state = jax.device_put(state, whole)
        del built, state  # their arrays now live in self.state, which the step donates
        evaluated = evaluation_graphdef(graphdef, self.state.params, self.state.rest)
        self._evaluate = jax.jit(make_eval(evaluated, task, mesh=self.mesh, compute_dtype=t.compute_dtype),
                                 out_shardings=whole, compiler_options=compiler_options(self.mesh))
        self.heldout = jax.jit(lambda: heldout(task), out_shardings=whole)()
        # a run has diverged when its held-out loss stays far above both chance and where it started (a large
        # init scale can start several times above chance: Zoology's figure-2 model starts at 10x)
        self.loss_bound = None
        if t.diverge_factor is not None:
            untrained = float(self._evaluate(self.state.params, self.state.rest, self.heldout)["loss"])
            chance = chance_loss(graphdef, task, self.state.params, self.state.rest, self.heldout)
            self.loss_bound = t.diverge_factor * max(untrained, chance)
        self.evals_above = 0  # evaluations in a row with the held-out loss above loss_bound

        self.ckpts = Checkpoints(run_dir / "checkpoints", config=resolved, keep=t.keep_checkpoints, mesh=self.mesh)
        self.progress = {"wall_seconds": 0.0, "target_step": None, "target_seconds": None}
        self.resumed_from = None
        if t.resume:
            restored = self.ckpts.resume(jax.eval_shape(lambda: self.state))
            if restored is None:
                log.info(f"train.resume: no checkpoint in {self.ckpts.directory} yet; starting from step 0")
            else:
                self.state, self.resumed_from = restored, int(restored.step)
                saved = self.ckpts.metrics(self.resumed_from)  # {} if unreadable: the state does not need them
                self.progress.update({k: saved[k] for k in PROGRESS_KEYS if k in saved})
        # the curve on disk, from the step the run continues from: lines a resumed run no longer holds are dropped
        self.metrics_file = MetricsFile(run_dir, self.resumed_from or 0) if is_primary() else None

        self.name = cfg.name or run_dir.name
        session = self.name if self.resumed_from is None else f"{self.name}-resume-{self.resumed_from}"
        group, tracked = group_and_config(self.name, resolved, sweep)
        logger = cfg.logger if is_primary() else dataclasses.replace(cfg.logger, mode="disabled")  # one wandb run
        # the run's record beside its config, so a dashboard can filter by the layer a grid cell resolved to
        self.tracker = Tracker(logger, run_dir, name=session, group=group, config={**tracked, **self.record})
        self.tracker.summary({"parameters": self.n_params})

        self.train_step = data_parallel_step(cfg, graphdef, tx, self.schedule, self.mesh)
        self.metric = f"eval/{task.target_metric}"
        self.last_eval: dict = {}
        self.shown: dict = {}  # the progress bar's training figures

    # -- the loop ---------------------------------------------------------

    def fit(self, stop: list[int]) -> dict:
        t, step = self.cfg.train, int(self.state.step)
        last = t.steps if t.stop_after is None else min(t.steps, step + t.stop_after)
        self._start = time.perf_counter()
        bar = tqdm(total=t.steps, initial=step, desc=self.name, dynamic_ncols=True, mininterval=0.5,
                   disable=not is_primary())
        with logging_redirect_tqdm(tqdm_class=tqdm):  # the console's log lines written around the bar
            return self._fit(stop, step, last, bar)

    def _fit(self, stop: list[int], step: int, last: int, bar) -> dict:
        t, status, pending = self.cfg.train, "completed", []
        try:
            while step < last:
                self.state, metrics = self.train_step(self.state)
                step += 1
                pending.append(metrics)
                due_eval = step % t.eval_every == 0 or step == last
                if step % t.log_every == 0 or due_eval or stop:
                    self._log(pending, step, bar)
                    pending = []
                if due_eval:
                    reached = self._eval(step)
                    self._show(bar)
                    if reached and t.early_stop:
                        status = "target_reached"
                        break
                if step % t.checkpoint_every == 0:
                    self._save()
                if stop:
                    status = "interrupted"
                    break
            else:
                if step < t.steps:
                    status = "paused"  # train.stop_after ended this session; resume continues
            if self.last_eval.get("eval/step") != step:
                self._eval(step)
            self._save()
        except TrainingDiverged:
            self._write_summary({"status": "diverged", "steps": step, "wall_seconds": self._seconds(),
                                 **self._eval_metrics()})
            self._close(bar, exit_code=1)
            raise
        except CheckpointError:  # a save that failed: the earlier checkpoints stand, and the summary says so
            with contextlib.suppress(OSError):  # unless the disk is full; with no checkpoint, train.py gives it back
                if self.ckpts.latest_step() is not None:
                    self._write_summary({"status": "save_failed", "steps": step, "wall_seconds": self._seconds(),
                                         "checkpoint_step": self.ckpts.latest_step(), **self._eval_metrics()})
            self._close(bar, exit_code=1)
            raise
        summary = self._summary(status, step)
        self.tracker.summary({k: v for k, v in summary.items() if isinstance(v, (int, float))})
        self._close(bar, exit_code=0 if status != "interrupted" else 1)
        summary = self._write_summary(summary)
        if stop:
            summary["signal"] = stop[0]
        return summary

    def _seconds(self) -> float:
        """Training wall time of the run: earlier sessions plus this one, compile included."""
        return float(self.progress["wall_seconds"]) + time.perf_counter() - self._start

    def _log(self, pending: list[dict], step: int, bar) -> None:
        host = jax.device_get(pending)
        means = {f"train/{k}": float(np.mean([m[k] for m in host])) for k in host[0]}
        self._check_finite(step)
        del means["train/lr"]  # the mean of the steps' rates; the record's `lr` is the schedule's at this step
        self._publish(step, means)
        bar.update(step - bar.n)
        self.shown = {"loss": f"{means['train/loss']:.3f}"}
        if "train/accuracy" in means:
            self.shown["acc"] = f"{means['train/accuracy']:.3f}"
        self._show(bar)

    def _show(self, bar) -> None:
        """The progress bar's figures: the last logged training means and the latest evaluation."""
        shown = dict(self.shown)
        if self.metric in self.last_eval:
            shown[self.metric] = f"{self.last_eval[self.metric]:.4f}"
        bar.set_postfix(shown)

    def _eval(self, step: int) -> bool:
        """Evaluate on the held-out set; True the first time the target is reached."""
        results = jax.device_get(self._evaluate(self.state.params, self.state.rest, self.heldout))
        self.last_eval = {f"eval/{k}": float(v) for k, v in results.items()}
        self._publish(step, self.last_eval)
        log.info(f"step {step}: " + " ".join(f"{k}={v:.4f}" for k, v in self.last_eval.items()))
        self.last_eval["eval/step"] = step
        self._check_bounded(step)
        if self.progress["target_step"] is None and self._reached(self.last_eval[self.metric]):
            self.progress.update(target_step=step, target_seconds=self._seconds())
            return True
        return False

    def _publish(self, step: int, metrics: dict) -> None:
        """One logged step's metrics, with the run's wall time and the schedule's rate, to wandb and the run's
        metrics.jsonl alike (tmem.train.record)."""
        values = {"wall_seconds": round(self._seconds(), 3), "lr": float(self.schedule(step)), **metrics}
        self.tracker.log(values, step)
        if self.metrics_file is not None:
            self.metrics_file.write(step, values)

    def _reached(self, value: float) -> bool:
        target, higher = self.cfg.train.target, self.cfg.task.higher_is_better
        return target is not None and (value >= target if higher else value <= target)

    def _check_finite(self, step: int) -> None:
        bad = int(self.state.nonfinite_step)
        if bad >= 0:
            raise TrainingDiverged(f"loss became NaN/Inf at step {bad + 1}; stopped at step {step}; "
                                   f"{self._last_good()}. {FIX}")

    def _check_bounded(self, step: int) -> None:
        """Count evaluations far above chance; enough in a row is a divergence with a finite loss."""
        t, loss = self.cfg.train, self.last_eval["eval/loss"]
        if self.loss_bound is None:
            return
        self.evals_above = self.evals_above + 1 if loss > self.loss_bound else 0
        if self.evals_above >= t.diverge_patience:
            raise TrainingDiverged(
                f"held-out loss {loss:.4g} at step {step} has been above {self.loss_bound:.4g} ({t.diverge_factor:g} "
                f"x the larger of chance and the untrained loss) at {self.evals_above} evaluations in a row; "
                f"{self._last_good()}. {FIX} (train.diverge_factor=null turns this check off)")

    def _last_good(self) -> str:
        last = self.ckpts.latest_step()
        return (f"the last good checkpoint is step {last} in {self.ckpts.directory} (still restorable)"
                if last is not None else "no checkpoint was written before it")

    def _save(self) -> None:
        self._check_finite(int(self.state.step))  # never overwrite good checkpoints with NaNs
        if self.evals_above:
            return  # nor with a state whose held-out loss is far above chance: the last good one stays
        self.ckpts.save(self.state, {**self._eval_metrics(), "eval/step": self.last_eval.get("eval/step"),
                                     **self.progress, "wall_seconds": self._seconds()})

    def _eval_metrics(self) -> dict:
        return {k: v for k, v in self.last_eval.items() if k != "eval/step"}

    def _summary(self, status: str, step: int) -> dict:
        total, per_token = state_sizes(self.cfg)
        seconds = self.progress["target_seconds"]
        return {
            "status": status,
            **self._eval_metrics(),
            "steps": step,
            "wall_seconds": round(self._seconds(), 3),
            "target_metric": self.metric,
            "target_value": self.cfg.train.target,
            "higher_is_better": self.cfg.task.higher_is_better,
            "target_step": self.progress["target_step"],
            "target_seconds": None if seconds is None else round(seconds, 3),
            "parameters": self.n_params,
            "devices": self.mesh.size,
            "state_size": total,
            "state_size_per_token": per_token,
            "resumed_from": self.resumed_from,
            "run_dir": str(self.run_dir),
            "checkpoint_dir": str(self.ckpts.directory),
            "checkpoint_step": self.ckpts.latest_step(),
            "wandb_dir": self.tracker.directory,
        }

    def _write_summary(self, summary: dict) -> dict:
        """Write `summary` with the run's record (tmem.train.resolved) as nested sections after it; return both."""
        summary = {**summary, **self.record}
        if is_primary():  # every process of a multi-process run holds the same summary; one writes it
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary

    def _close(self, bar, exit_code: int) -> None:
        bar.close()
        self.tracker.finish(exit_code=exit_code)
        if self.metrics_file is not None:
            self.metrics_file.close()
