"""Train a model from the Hydra configs in configs/.

    python train.py                                  # the default MQAR job
    python train.py mixer.heads=2 optim.lr=1e-3      # override any field
    python train.py -m model.width=32,64             # a multirun, one directory per job
    python train.py hydra.run.dir=runs/a train.resume=true   # continue a run
"""

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from tmem.config import ConfigError, check_group_overrides, check_output_dirs, validate


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> dict:
    try:
        config = validate(cfg)
    except ConfigError as e:
        sys.exit(f"config error: {e}")

    from tmem.train.checkpoint import CheckpointError  # after validation: jax loads slowly
    from tmem.train.loop import TrainingDiverged, run

    run_dir = HydraConfig.get().runtime.output_dir
    try:
        summary = run(config, run_dir, OmegaConf.to_container(cfg, resolve=True))
    except (TrainingDiverged, CheckpointError) as e:
        sys.exit(f"error: {e}")
    metrics = ", ".join(f"{k}={v:.4f}" for k, v in summary.items() if k.startswith("eval/"))
    reached = ("not reached" if summary["target_step"] is None else
               f"reached at step {summary['target_step']} after {summary['target_seconds']:.1f} s")
    print(f"{summary['status']} after {summary['steps']} steps in {summary['wall_seconds']:.1f} s: {metrics}")
    compare = ">=" if config.task.higher_is_better else "<="
    print(f"target {summary['target_metric']} {compare} {summary['target_value']}: {reached}")
    print(f"run:        {summary['run_dir']}")
    print(f"checkpoint: {summary['checkpoint_dir']} (step {summary['checkpoint_step']})")
    print(f"wandb:      {summary['wandb_dir'] or 'disabled'}")
    if "signal" in summary:
        sys.exit(128 + summary["signal"])
    return summary


if __name__ == "__main__":
    problem = check_group_overrides(sys.argv[1:]) or check_output_dirs(sys.argv[1:])
    if problem:
        sys.exit(f"config error: {problem}")
    main()
