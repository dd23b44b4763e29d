"""tmem.sweeps.cost: a sweep's jobs are the ones Hydra would launch, each counted as its own step."""

import pytest

from conftest import compose_config
from tmem.config import ConfigError, validate
from tmem.flops import step_flops
from tmem.sweeps import cost


def test_the_grid_crosses_the_experiments_params_with_the_commands_own_replacing_them():
    jobs = cost.grid(["-m", "experiment=capacity_gap", "mixer=softmax", "model.width=16,32,48", "train.steps=7"])
    # capacity_gap sweeps mixer (3), model.width (2), num_kv_pairs (1) and optim.lr (2): the command's single
    # mixer and its three widths replace the first two, the rates stay
    assert len(jobs) == 3 * 2
    assert all("mixer=softmax" in job and "train.steps=7" in job for job in jobs)
    assert {line for job in jobs for line in job if line.startswith("model.width")} == {
        "model.width=16", "model.width=32", "model.width=48"}
    assert {line for job in jobs for line in job if line.startswith("optim.lr")} == {"optim.lr=null",
                                                                                    "optim.lr=0.003"}


def test_each_job_counts_its_own_step_to_its_cap_and_the_total_adds_them():
    args = ["experiment=capacity_gap", "mixer=softmax,linear", "model.width=32", "optim.lr=null", "train.steps=300"]
    jobs, total = cost.estimate(args)
    assert [job[0] for job, _, _ in jobs] == ["mixer=softmax", "mixer=linear"]
    for job, flops, steps in jobs:
        assert steps == 300
        assert flops == step_flops(validate(compose_config(job)))["total"]
    assert total == pytest.approx(sum(flops * 300 for _, flops, _ in jobs))
    assert jobs[0][1] != jobs[1][1]  # the rows' steps differ: each job was composed, not the first reused
    assert "2 jobs" in cost.report(args, rates=(1.0,))


def test_a_cell_the_config_refuses_is_refused_here_in_one_line():
    with pytest.raises(ConfigError, match="mixer.heads"):
        cost.estimate(["experiment=capacity_gap", "mixer=mamba", "model.width=32", "optim.lr=null"])
