"""The cluster launcher config (hydra/launcher=slurm) composes, and submitit turns it into an sbatch script.

No SLURM here: the launcher's own `launch` runs with submitit's check for
`srun` and its submission replaced, so the test sees the sbatch script the
plugin would submit, with every field of configs/hydra/launcher/slurm.yaml
accepted by submitit.
"""

import pytest
import submitit
from hydra.utils import instantiate

from conftest import TINY
from tmem.command import compose_command
from tmem.config import CONFIG_DIR
from tmem.train import rundir


def test_the_slurm_launcher_composes_and_a_sweep_with_it_is_prepared(tmp_path):
    args = ["-m", "hydra/launcher=slurm", "hydra.launcher.partition=gpu", *TINY, "model.width=16,32"]
    pinned = rundir.prepare([*args, f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    assert pinned[-1] == f"hydra.sweep.dir={tmp_path / 'sweep'}"
    cfg = compose_command(pinned, sweeps=False)
    assert cfg.hydra.launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert cfg.hydra.launcher.submitit_folder == f"{tmp_path / 'sweep'}/.submitit/%j"  # beside the jobs, shared


def test_submitit_accepts_every_field_and_writes_the_sbatch_script(tmp_path, monkeypatch):
    cfg = compose_command(["-m", "hydra/launcher=slurm", "hydra.launcher.partition=gpu",
                           f"hydra.sweep.dir={tmp_path}"], sweeps=False)
    launcher = instantiate(cfg.hydra.launcher)
    launcher.setup(hydra_context=None, task_function=None, config=cfg)
    scripts = []

    def submit(executor, fn, *job_args):  # instead of sbatch: the script of a one-job array
        assert len(job_args[0]) == 2
        scripts.append(executor._executor._make_submission_file_text("python -u -m submitit.core._submit", "x"))
        return []

    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 1))  # "is srun here?"
    monkeypatch.setattr(submitit.AutoExecutor, "map_array", submit)
    assert launcher.launch([["model.width=16"], ["model.width=32"]], initial_job_idx=0) == []
    (script,) = scripts
    for line in ("#SBATCH --partition=gpu", "#SBATCH --gpus-per-node=1", "#SBATCH --ntasks-per-node=1",
                 "#SBATCH --cpus-per-task=8", "#SBATCH --mem=32GB", "#SBATCH --time=240", "#SBATCH --nodes=1",
                 "export XLA_PYTHON_CLIENT_PREALLOCATE=false"):
        assert line in script, line


@pytest.mark.parametrize("launcher", ["local", "slurm"])
def test_every_launcher_config_has_a_usage_line(launcher):
    text = (CONFIG_DIR / "hydra" / "launcher" / f"{launcher}.yaml").read_text()
    assert f"python train.py -m hydra/launcher={launcher}" in text
