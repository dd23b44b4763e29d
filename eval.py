"""Run probes on a trained run and write <run>/eval/report.json with its figures.

    python eval.py run=outputs/2026-11-29/13-20-00 'probes=[mqar_distance]'
    python eval.py run=<run dir> step=1000 'probes=[mqar_distance]'
"""

import sys
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from hydra.core.hydra_config import HydraConfig

from tmem.config import ConfigError, LoggerConfig, parse_group


def eval_dir(run) -> str:
    """Reports go beside the run they describe; runless probes get their own folder."""
    return str(Path(run) / "eval") if run else time.strftime("outputs/probes/%Y-%m-%d/%H-%M-%S")


OmegaConf.register_new_resolver("tmem.eval_dir", eval_dir, replace=True)


@hydra.main(version_base="1.3", config_path="configs", config_name="eval")
def main(cfg: DictConfig) -> dict:
    from tmem.train.checkpoint import CheckpointError
    from tmem.train.evaluate import evaluate

    try:
        logger = parse_group("logger", LoggerConfig, cfg.logger)
        probes = list(cfg.probes) if not isinstance(cfg.probes, str) else [cfg.probes]
        out_dir = Path(HydraConfig.get().runtime.output_dir)
        report = evaluate(cfg.run, probes, out_dir=out_dir, step=cfg.step, logger=logger,
                          seed=cfg.seed, options=OmegaConf.to_container(cfg.options, resolve=True))
    except (ConfigError, CheckpointError) as e:
        sys.exit(f"error: {e}")
    print(f"report: {out_dir.absolute() / 'report.json'} (step {report['step']})")
    for name, path in report.get("figures", {}).items():
        print(f"figure: {path}")
    return report


def check_run_arg(argv: list[str]) -> str | None:
    """A run= that names no directory, found before Hydra creates <run>/eval for it."""
    for arg in argv:
        if arg.startswith("run=") and arg[4:] not in ("", "null") and not Path(arg[4:]).is_dir():
            return f"run={arg[4:]}: no such directory"
    return None


if __name__ == "__main__":
    problem = check_run_arg(sys.argv[1:])
    if problem:
        sys.exit(f"error: {problem}")
    main()
