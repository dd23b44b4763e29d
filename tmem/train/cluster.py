"""Many processes training one run: JAX's own multi-host set-up, and which process writes what.

With `cluster=multihost`, `train.py` calls `jax.distributed.initialize` once,
before anything starts a JAX backend, so the same command runs under srun, a
SLURM array job from Hydra's submitit launcher, or by hand on each host. The
data mesh (tmem.train.mesh) then spans every process's devices and each step
is one SPMD program: every process samples the same global batch from the
same key, inside the jitted step, and keeps only its devices' part of it, so
no batch is ever sent between hosts.

Process 0 alone claims the run directory, writes summary.json and keeps the
wandb run; orbax saves and loads checkpoints from every process together, and
tmem's own file work around a save (moving a damaged step aside, deleting old
ones) is process 0's, between two barriers.
"""

from __future__ import annotations

from tmem.config import ClusterConfig, ConfigError


def process_id(cfg: ClusterConfig) -> int:
    """This process's rank, known before JAX starts: the run directory's claim and record are rank 0's.

    Given (cluster.process_id), or read from the environment by JAX's own
    cluster detection, the one `jax.distributed.initialize` will use. 0 where
    there is no cluster to find: the process that submits a sweep to SLURM
    trains nothing, and a job that finds none stops in `start`.
    """
    if not cfg.initialize:
        return 0
    if cfg.process_id is not None:
        return cfg.process_id
    found = detected()
    return 0 if found is None else int(found.get_process_id())


def detected():
    """The cluster JAX's automatic initialisation would find in this environment (its ClusterEnv class), or None.

    jax has no public function for this; `ClusterEnv` is the class
    `jax.distributed.initialize` itself asks, so the rank read here is the
    rank JAX will give the process.
    """
    from jax._src.clusters import ClusterEnv

    return next((env for env in ClusterEnv._cluster_types if not env.opt_in_only_method and env.is_env_present()),
                None)


def start(cfg: ClusterConfig) -> None:
    """Join the run's processes (once, before any JAX backend starts); nothing for a one-process run."""
    if not cfg.initialize:
        return
    import jax

    if jax.distributed.is_initialized():
        return
    given = (cfg.coordinator, cfg.processes, cfg.process_id)
    if None in given and detected() is None:
        raise ConfigError("cluster=multihost found no cluster in the environment (SLURM, Open MPI, Cloud TPU): "
                          "set cluster.coordinator=host:port, cluster.processes and cluster.process_id")
    jax.distributed.initialize(cfg.coordinator, cfg.processes, cfg.process_id, initialization_timeout=cfg.timeout)


def is_primary() -> bool:
    """True in the process that writes the run's single-writer files (summary, wandb, file work on checkpoints)."""
    import jax

    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process reaches the barrier `name`; nothing with one process."""
    import jax

    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
