"""Many processes train one run: two train.py processes on localhost agree with one process. And one process
trains on every core of a CPU, each a device (cluster.cpu_devices).

Each process is a separate `python train.py cluster=multihost ...` with one
CPU device, joined by jax.distributed over loopback (CPU collectives: gloo,
jax 0.12's default), so this is what a cluster launcher runs, on one machine.
"""

import json
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from omegaconf import OmegaConf

from conftest import ROOT, TINY, compose_config, run_entry
from tmem.config import ConfigError, validate
from tmem.schema import ClusterConfig, TrainConfig
from tmem.train import rundir
from tmem.train.cluster import compilation_cache, cpu_devices, process_id, start

RUN = [*TINY, "model.depth=1", "train.microbatch=8", "train.steps=4", "train.log_every=2", "train.eval_every=4",
       "train.checkpoint_every=4", "train.diverge_factor=null"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_train_as_one(tmp_path):
    from tmem.train.build import build
    from tmem.train.checkpoint import Checkpoints
    from tmem.train.loop import run

    run_dir = tmp_path / "two"
    cluster = ["cluster=multihost", f"cluster.coordinator=localhost:{free_port()}", "cluster.processes=2",
               "cluster.timeout=120", f"hydra.run.dir={run_dir}"]
    args = [*RUN, "logger=offline", *cluster]  # wandb on: only process 0 may keep a run
    procs = [subprocess.Popen([sys.executable, "train.py", *args, f"cluster.process_id={i}"], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in (1, 0)]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    assert "training on 2 cpu devices of 2 processes: each batch" in outs[1]
    assert (run_dir / "train.log").read_text().count("training on 2 cpu devices") == 1  # rank 0's alone

    cfg = compose_config(RUN)
    one = run(validate(cfg), tmp_path / "one", OmegaConf.to_container(cfg, resolve=True))
    two = json.loads((run_dir / "summary.json").read_text())
    assert two["devices"] == 2 and one["devices"] == 1 and two["steps"] == one["steps"] == 4
    np.testing.assert_allclose(two["eval/loss"], one["eval/loss"], rtol=1e-5)

    # the checkpoint the two processes saved together restores in one process, equal to the one-process run's
    abstract = jax.eval_shape(lambda: build(validate(cfg)).state)
    a, b = (jax.tree.leaves(Checkpoints(d / "checkpoints").restore(abstract).params)
            for d in (run_dir, tmp_path / "one"))
    assert max(float(np.abs(x - y).max()) for x, y in zip(a, b)) < 1e-5
    # one writer: one claim, one wandb run (process 0's), no second record
    assert len(list(run_dir.glob("wandb/offline-run-*"))) == 1
    assert json.loads((run_dir / rundir.CLAIM).read_text())["pid"] == procs[1].pid


def test_the_rank_comes_from_the_config_or_the_environment(monkeypatch):
    assert process_id(ClusterConfig()) == 0  # one process
    assert process_id(ClusterConfig(initialize=True, processes=4, process_id=3)) == 3
    for var in ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID"):
        monkeypatch.setenv(var, {"SLURM_STEP_NODELIST": "node[001-002]", "SLURM_NTASKS": "2"}.get(var, "1"))
    assert process_id(ClusterConfig(initialize=True)) == 1  # read as JAX's own SLURM detection reads it
    assert process_id(ClusterConfig()) == 0  # a one-process run ignores the cluster around it


def test_a_cpu_shows_one_device_per_core_as_many_as_split_the_batch():
    def devices(batch=16, microbatch=None, cores=2, environ=None, cluster=ClusterConfig(cpu_devices="auto")):
        return cpu_devices(cluster, TrainConfig(batch_size=batch, microbatch=microbatch), cores, environ or {})

    assert devices() == 2 and devices(cores=1) == 1
    assert devices(cores=8) == 2  # shares of 8 examples at least
    assert devices(64, 32, cores=16) == 8 and devices(48, cores=16) == 6  # the microbatch is a cap per device
    assert devices(cores=3) == 2  # 16 does not split three ways
    assert devices(48, 24, cores=4) == 4  # parts of 12, each one slice
    assert devices(48, 16, cores=2) == 1  # parts of 24 do not split into slices of 16
    assert devices(12, 6, cores=4) == 1  # shares of 6 and 3 are too small
    assert devices(16, 32, cores=2) == 2  # a microbatch above the batch is no slice
    assert devices(cluster=ClusterConfig(cpu_devices=4)) == 4  # asked for: more than the cores is allowed
    assert devices(environ={"XLA_FLAGS": "--xla_cpu_enable_fast_math=false"}) == 2
    for given in ({"JAX_NUM_CPU_DEVICES": "1"}, {"XLA_FLAGS": "--xla_force_host_platform_device_count=3"}):
        assert devices(environ=given) is None and devices(environ=given, cluster=ClusterConfig(cpu_devices=2)) is None
    assert devices(cluster=ClusterConfig(initialize=True, cpu_devices="auto")) is None  # JAX's one CPU device each
    assert devices(cluster=ClusterConfig()) == 2  # the default: auto


@pytest.mark.slow  # 8 s: a tiny run
def test_train_py_trains_on_the_cpu_devices_it_is_asked_for(tmp_path):
    done = run_entry("train.py", *TINY, "cluster.cpu_devices=2", f"hydra.run.dir={tmp_path}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "summary.json").read_text())["devices"] == 2
    assert "training on 2 cpu devices: each batch" in done.stdout


def test_a_count_asked_for_after_jax_started_must_be_the_one_it_has(monkeypatch):
    import dataclasses

    monkeypatch.delenv("JAX_NUM_CPU_DEVICES", raising=False)
    monkeypatch.setenv("XLA_FLAGS", "")
    cfg = validate(compose_config([*TINY, "train.batch_size=64", "train.microbatch=null"]))
    have = len(jax.devices("cpu"))  # this process's backend runs
    start(dataclasses.replace(cfg, cluster=ClusterConfig(cpu_devices="auto")))  # auto: a preference, left as it is
    start(dataclasses.replace(cfg, cluster=ClusterConfig(cpu_devices=have)))
    with pytest.raises(ConfigError, match=f"cluster.cpu_devices={2 * have}: JAX already started with {have} CPU"):
        start(dataclasses.replace(cfg, cluster=ClusterConfig(cpu_devices=2 * have)))


def test_compiled_programs_persist_in_the_configs_folder_unless_jax_has_one(tmp_path):
    import dataclasses

    cfg = validate(compose_config(TINY))
    assert cfg.cluster.compilation_cache == "~/.cache/tmem/jax"  # on by default, per user
    here = ClusterConfig(compilation_cache=str(tmp_path))
    assert compilation_cache("~/cc", None) == str(Path.home() / "cc")
    assert compilation_cache(str(tmp_path), "/from/the/environment") is None  # JAX_COMPILATION_CACHE_DIR's, or code's
    assert compilation_cache(None, None) is None  # null: none
    before = jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs
    try:  # the tests' own cache (conftest) set aside
        jax.config.update("jax_compilation_cache_dir", None)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
        start(dataclasses.replace(cfg, cluster=here))
        assert jax.config.jax_compilation_cache_dir == str(tmp_path)
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0  # every program, not only slow ones
        start(dataclasses.replace(cfg, cluster=ClusterConfig(compilation_cache="/elsewhere")))
        assert jax.config.jax_compilation_cache_dir == str(tmp_path)  # one already set stays
    finally:
        jax.config.update("jax_compilation_cache_dir", before[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])


@pytest.mark.parametrize("overrides, message", [
    (["cluster.cpu_devices=two"], "cluster.cpu_devices='two' must be a positive integer or auto"),
    (["cluster.cpu_devices=0"], "cluster.cpu_devices=0 must be positive"),
    ([*TINY, "cluster.cpu_devices=3"], "cluster.cpu_devices=3: train.batch_size=16 does not split evenly over 3 "
                                       "devices; give another count, or cluster.cpu_devices=auto"),
    ([*TINY, "train.batch_size=48", "train.microbatch=16", "cluster.cpu_devices=2"],
     "cluster.cpu_devices=2: train.microbatch=16 does not divide the 24 examples each of 2 devices gets of "
     "train.batch_size=48"),
    (["cluster.process_id=2", "cluster.processes=2"], "cluster.process_id=2 must be in 0..cluster.processes-1"),
    (["cluster.coordinator=node0"], "cluster.coordinator='node0' must be host:port"),
    (["cluster.coordinator=node0:http"], "cluster.coordinator='node0:http' must be host:port, a port from 1 to 65535"),
    (["cluster.processes=0"], "cluster.processes=0 must be positive"),
])
def test_bad_cluster_fields_are_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose_config(["cluster=multihost", *overrides]))


def test_a_process_other_than_rank_0_claims_nothing_and_needs_the_run_directory(tmp_path):
    given = ["cluster=multihost", "cluster.coordinator=h:1", "cluster.processes=2", "cluster.process_id=1"]
    with pytest.raises(ConfigError, match="give hydra.run.dir"):
        rundir.prepare([*TINY, *given])
    with pytest.raises(ConfigError, match="give hydra.sweep.dir"):
        rundir.prepare(["-m", *TINY, *given, "model.width=16,32"])
    args = rundir.prepare([*TINY, *given, f"hydra.run.dir={tmp_path / 'run'}"])
    assert args[-3:] == [f"hydra.run.dir={tmp_path / 'run'}", "hydra.output_subdir=null",
                         "hydra.job_logging.root.handlers=[console]"]  # train.log is rank 0's
    assert not (tmp_path / "run").exists()  # rank 0 claims it
    rank0 = rundir.prepare([*TINY, *given[:-1], "cluster.process_id=0", f"hydra.run.dir={tmp_path / 'run'}"])
    assert (tmp_path / "run" / rundir.CLAIM).is_file() and "hydra.output_subdir=null" not in rank0


def test_a_run_saved_before_the_cluster_and_implementation_fields_resumes(tmp_path):
    resolved = OmegaConf.to_container(compose_config(TINY), resolve=True)
    old = {k: v for k, v in resolved.items() if k != "cluster"}
    old["mixer"] = {**resolved["mixer"], "run": {}}  # no implementation
    (tmp_path / ".hydra").mkdir()
    OmegaConf.save(OmegaConf.create(old), tmp_path / ".hydra" / "config.yaml")
    rundir.check_resume(tmp_path, resolved)  # neither is the run itself
    with pytest.raises(ConfigError, match="model.width"):
        rundir.check_resume(tmp_path, {**resolved, "model": {**resolved["model"], "width": 32}})


def meet(port: int, processes: int, ranks, timeout: float = 1.5) -> dict[int, str]:
    """Each rank's rendezvous at localhost:port, the others in threads: "ok" or its one-line refusal."""
    import threading

    from tmem.train.cluster import RendezvousFailed, rendezvous

    said: dict[int, str] = {}

    def one(rank):
        try:
            rendezvous(f"localhost:{port}", processes, rank, timeout)
            said[rank] = "ok"
        except RendezvousFailed as e:
            said[rank] = str(e)

    threads = [threading.Thread(target=one, args=(r,)) for r in ranks if r != 0]
    for t in threads:
        t.start()
    if 0 in ranks:
        one(0)
    for t in threads:
        t.join()
    return said


def test_the_processes_meet_before_jax_does_and_a_missing_one_is_named():
    assert meet(free_port(), 3, (0, 1, 2)) == {0: "ok", 1: "ok", 2: "ok"}
    port = free_port()
    said = meet(port, 3, (0, 2))  # process 1 never starts
    assert said[0].startswith(f"cluster.coordinator=localhost:{port}: 2 of 3 processes joined (missing: process_id 1)"
                              " within cluster.timeout=1.5 s")
    assert said[2].startswith(f"cluster.coordinator=localhost:{port}: process 2 joined, but not all processes did")
    alone = meet(free_port(), 2, (1,), timeout=0.5)  # no process 0
    assert "process 1 found no process 0 listening within cluster.timeout=0.5 s" in alone[1]
    assert all("\n" not in line for line in (*said.values(), *alone.values()))


@pytest.mark.slow  # about 15 s: a train.py process
def test_a_cluster_whose_peer_never_comes_exits_in_one_line_and_gives_the_directory_back(tmp_path):
    port, run = free_port(), tmp_path / "run"
    done = run_entry("train.py", *RUN, "cluster=multihost", f"cluster.coordinator=127.0.0.1:{port}",
                     "cluster.processes=2", "cluster.process_id=0", "cluster.timeout=3", f"hydra.run.dir={run}",
                     timeout=120)
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [
        f"error: cluster.coordinator=127.0.0.1:{port}: 1 of 2 processes joined (missing: process_id 1) within "
        "cluster.timeout=3 s: start every process with the same cluster.coordinator and cluster.processes, or raise "
        "cluster.timeout"], done.stderr[-3000:]
    assert not run.exists()  # the same command, with its peer, may run there next
