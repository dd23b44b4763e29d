"""Run probes on a trained run and write <run>/eval/report.json with its figures.

    python eval.py run=outputs/2026-11-29/13-20-00 'probes=[mqar_distance]'
    python eval.py run=<run dir> step=1000 'probes=[mqar_distance]'
    python eval.py run=<run dir> 'probes=[heldout,mqar_distance]' task.seq_len=256 task.num_kv_pairs=32

`task.<field>=` overrides a field of the run's task for every probe (the model
stays as trained); such a report goes to <run>/eval/<the overrides>/, e.g.
<run>/eval/task.num_kv_pairs=32,task.seq_len=256/, beside the others.
"""

import logging
import sys
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from hydra.core.hydra_config import HydraConfig

from tmem.config import ConfigError, parse_group
from tmem.schema import LoggerConfig

log = logging.getLogger("eval")  # Hydra's job logging: the console and <report dir>/eval.log


def eval_dir(run, task=None) -> str:
    """Reports go beside the run they describe, one folder per set of task overrides; runless probes get
    their own folder."""
    if not run:
        return time.strftime("outputs/probes/%Y-%m-%d/%H-%M-%S")
    if not task:
        return str(Path(run) / "eval")
    from tmem.train.task_overrides import spelled

    return str(Path(run) / "eval" / spelled(OmegaConf.to_container(task, resolve=True)))


OmegaConf.register_new_resolver("tmem.eval_dir", eval_dir, replace=True)


@hydra.main(version_base="1.3", config_path="configs", config_name="eval")
def main(cfg: DictConfig) -> dict:
    from tmem.train.checkpoint import CheckpointError
    from tmem.train.cluster import use_compilation_cache
    from tmem.train.evaluate import evaluate

    use_compilation_cache(cfg.compilation_cache)  # the probes' programs, compiled once across evaluations
    try:
        logger = parse_group("logger", LoggerConfig, cfg.logger)
        probes = list(cfg.probes) if not isinstance(cfg.probes, str) else [cfg.probes]
        out_dir = Path(HydraConfig.get().runtime.output_dir)
        report = evaluate(cfg.run, probes, out_dir=out_dir, step=cfg.step, logger=logger,
                          seed=cfg.seed, options=OmegaConf.to_container(cfg.options, resolve=True),
                          task=task_overrides(cfg))
    except (ConfigError, CheckpointError) as e:
        sys.exit(f"error: {e}")
    log.info(f"report: {out_dir.absolute() / 'report.json'} (step {report['step']})")
    for name, path in report.get("figures", {}).items():
        log.info(f"figure: {path}")
    return report


def check_command(argv: list[str]) -> None:
    """The request checked before Hydra creates <run>/eval: a refused command writes nothing in the run."""
    from tmem.command import compose_command
    from tmem.train.evaluate import check_request

    cfg = compose_command(argv, "eval")
    probes = list(cfg.probes) if not isinstance(cfg.probes, str) else [cfg.probes]
    check_request(cfg.run, probes, cfg.step, task_overrides(cfg))


def task_overrides(cfg: DictConfig) -> dict:
    """The command line's `task.<field>=value` overrides, field -> value (checked by tmem.train.task_overrides)."""
    return OmegaConf.to_container(cfg.task, resolve=True)


if __name__ == "__main__":
    from tmem.train.checkpoint import CheckpointError

    try:
        check_command(sys.argv[1:])
    except (ConfigError, CheckpointError) as e:
        sys.exit(f"error: {e}")
    main()
