"""How far healthy runs stay below the finite-divergence bound (train.diverge_factor), measured.

    python benchmarks/divergence_margin.py                       # Zoology's figure-2 recipe and the linear row
    python benchmarks/divergence_margin.py --runs linear --steps 300

A run stops as diverged when its held-out loss stays above diverge_factor
times the larger of chance and its untrained loss. The runs that must not stop
are the slow ones: Zoology's figure-2 recipe, which sits near 0.26 accuracy
for a thousand steps, and the fast-weight rows, which take thousands of steps
to 0.99. Each run here trains with early stopping off and prints its highest
held-out loss as a fraction of its bound (1.0 would stop it).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tmem.config import validate  # noqa: E402
from tmem.train import loop  # noqa: E402

RUNS = {"zoology_fig2": ["experiment=zoology_fig2"], "linear": ["mixer=linear"]}


def margin(overrides: list[str], steps: int) -> dict:
    """Train one run; its bound, its highest held-out loss over the bound, and its final accuracy."""
    seen = []

    class Recording(loop.Trainer):
        def _check_bounded(self, step):
            seen.append((step, self.last_eval["eval/loss"], self.loss_bound))
            super()._check_bounded(step)

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=[*overrides, f"train.steps={steps}", "train.eval_every=50",
                                          "train.early_stop=false", "logger=disabled"])
    config = validate(cfg)
    with tempfile.TemporaryDirectory() as run_dir, loop.stop_requests() as stop:
        summary = Recording(config, Path(run_dir), OmegaConf.to_container(cfg, resolve=True)).fit(stop)
    step, loss, bound = max(seen, key=lambda s: s[1] / s[2])
    return {"bound": round(bound, 3), "highest_fraction": round(loss / bound, 4), "at_step": step,
            "status": summary["status"], "final_accuracy": summary.get("eval/accuracy")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    for name in args.runs:
        print(json.dumps({"run": name, "steps": args.steps, **margin(RUNS[name], args.steps)}), flush=True)


if __name__ == "__main__":
    main()
