"""Train a model from the Hydra configs in configs/.

    python train.py                                  # the default MQAR job
    python train.py mixer.heads=2 optim.lr=1e-3      # override any field
    python train.py -m model.width=32,64             # a multirun, one directory per job
    python train.py hydra.run.dir=runs/a train.resume=true   # continue a run
"""

import logging
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from tmem.config import ConfigError, saved_form, validate
from tmem.train import rundir
from tmem.train.cluster import process_id, start
from tmem.train.resolved import describe_config

log = logging.getLogger("train")  # Hydra's job logging: the console and <run dir>/train.log


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> dict:
    hydra_cfg = HydraConfig.get()
    run_dir = hydra_cfg.runtime.output_dir
    try:
        config, resolved = validate(cfg), saved_form(cfg)
        primary = process_id(config.cluster) == 0  # of a multi-process run, only rank 0 claims and records it
        if hydra_cfg.mode == RunMode.MULTIRUN and primary:  # a job of a sweep whose directory `prepare` claimed
            if config.train.resume and rundir.holds_run(run_dir):
                rundir.check_resume(run_dir, resolved)
            else:
                rundir.claim(run_dir, hydra_wrote=True)
    except ConfigError as e:
        sys.exit(f"config error: {e}")
    log.info(describe_config(config))

    from tmem.train.checkpoint import CheckpointError  # after validation: orbax loads slowly
    from tmem.train.cluster import RendezvousFailed
    from tmem.train.loop import TrainingDiverged, run
    from tmem.train.tracking import finish_open, sweep_job

    try:
        start(config)  # the CPU's devices and, for cluster=multihost, jax.distributed.initialize: before JAX starts
        summary = run(config, run_dir, resolved, sweep=sweep_job(hydra_cfg))
    except BaseException as e:
        # a run that ended before its first checkpoint or summary never started: its directory is given back as
        # it was, so the same command runs again (a resumed run's, or one with a result, stays as it is)
        if primary:
            finish_open(exit_code=1)  # wandb's files first: its own exit hook would write them after the release
            rundir.release(run_dir)
        if isinstance(e, ConfigError):  # one the config cannot know before it sees the devices: an uneven batch
            sys.exit(f"config error: {e}")
        if isinstance(e, (TrainingDiverged, CheckpointError, RendezvousFailed)):
            sys.exit(f"error: {e}")
        raise
    metrics = ", ".join(f"{k}={v:.4f}" for k, v in summary.items() if k.startswith("eval/"))
    reached = ("not reached" if summary["target_step"] is None else
               f"reached at step {summary['target_step']} after {summary['target_seconds']:.1f} s")
    log.info(f"{summary['status']} after {summary['steps']} steps in {summary['wall_seconds']:.1f} s: {metrics}")
    compare = ">=" if config.task.higher_is_better else "<="
    log.info(f"target {summary['target_metric']} {compare} {summary['target_value']}: {reached}")
    log.info(f"run:        {summary['run_dir']}")
    log.info(f"checkpoint: {summary['checkpoint_dir']} (step {summary['checkpoint_step']})")
    log.info(f"wandb:      {summary['wandb_dir'] or 'disabled'}")
    if "signal" in summary:
        sys.exit(128 + summary["signal"])
    return summary


if __name__ == "__main__":
    try:  # before Hydra writes anything: a command refused here leaves every file as it was
        sys.argv[1:] = rundir.prepare(sys.argv[1:])
    except ConfigError as e:
        sys.exit(f"config error: {e}")
    main()
