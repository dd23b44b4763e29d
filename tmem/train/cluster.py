"""Many processes training one run: JAX's own multi-host set-up, and which process writes what.

On a CPU, `start` first makes the cores devices of their own
(`cluster.cpu_devices`), so one process trains data-parallel over them.
With `cluster=multihost`, `train.py` calls `jax.distributed.initialize` once,
before anything starts a JAX backend, so the same command runs under srun, a
SLURM array job from Hydra's submitit launcher, or by hand on each host. The
data mesh (tmem.train.mesh) then spans every process's devices and each step
is one SPMD program: each device samples its own share of the global batch
from the same key, inside the jitted step (tasks.draw_rows), so no batch is
ever sent between hosts, only the summed gradients.

Process 0 alone claims the run directory, writes summary.json and keeps the
wandb run; orbax saves and loads checkpoints from every process together, and
tmem's own file work around a save (moving a damaged step aside, deleting old
ones) is process 0's, between two barriers.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Mapping

from tmem.config import ConfigError
from tmem.schema import ClusterConfig, Config, TrainConfig

# the smallest share of a slice `auto` gives a device: shares of 8 and up were measured faster on two devices than
# whole slices on one (BENCHMARKS.md); smaller shares, on machines with more cores, were not measured
MIN_SHARE = 8


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


def cpu_devices(cluster: ClusterConfig, train: TrainConfig, cores: int, environ: Mapping[str, str]) -> int | None:
    """How many devices the CPU should show JAX, or None to leave JAX's own count (the environment's, or one).

    `auto` gives one device per core, up to the largest count that splits the
    batch evenly into shares (TrainConfig.split) of at least MIN_SHARE
    examples: on a CPU the step's operations are too small to keep two cores
    busy from one stream, and two devices each running their own share on
    their own core do.
    """
    if "JAX_NUM_CPU_DEVICES" in environ or "--xla_force_host_platform_device_count" in environ.get("XLA_FLAGS", ""):
        return None
    if cluster.cpu_devices != "auto":
        return cluster.cpu_devices  # validation checked that it divides the slices
    if cluster.initialize:
        return None
    return max(n for n in range(1, max(cores, 1) + 1)
               if n == 1 or (not train.uneven(n) and train.split(n)[1] >= MIN_SHARE))


def compilation_cache(folder: str | None, current: str | None) -> str | None:
    """The folder to give JAX's persistent compilation cache, or None to leave JAX's setting (`current`: the
    JAX_COMPILATION_CACHE_DIR environment variable's, or one set in code, wins; so does `null`, no cache)."""
    if folder is None or current is not None:
        return None
    return os.path.expanduser(folder)


def use_compilation_cache(folder: str | None) -> None:
    """Keep compiled programs in `folder` across processes (train.py's cluster.compilation_cache, eval.py's
    compilation_cache), unless JAX has a cache already; before anything compiles."""
    import jax

    cache = compilation_cache(folder, jax.config.jax_compilation_cache_dir)
    if cache is not None:  # every program, not only those over JAX's default of 1 s: a run compiles ~80 small ones
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)


def usable_cores() -> int:
    """The cores this process may run on (its affinity, which a container or taskset may narrow)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def start(cfg: Config) -> None:
    """Before any JAX backend starts: set where compiled programs persist and how many devices the CPU shows, and
    join the run's processes.

    Where a backend already runs (a notebook or a test that trained before), its
    CPU devices stay as they are; a count asked for by number must match them.
    """
    import jax
    from jax._src.xla_bridge import backends_are_initialized  # jax has no public test for a started backend

    use_compilation_cache(cfg.cluster.compilation_cache)
    wanted = cpu_devices(cfg.cluster, cfg.train, usable_cores(), os.environ)
    if wanted is not None and not backends_are_initialized():
        jax.config.update("jax_num_cpu_devices", wanted)
    elif wanted is not None and cfg.cluster.cpu_devices != "auto" and len(jax.devices("cpu")) != wanted:
        raise ConfigError(f"cluster.cpu_devices={wanted}: JAX already started with {len(jax.devices('cpu'))} CPU "
                          "devices in this process; set it before anything runs JAX")
    cluster = cfg.cluster
    if not cluster.initialize or jax.distributed.is_initialized():
        return
    given = (cluster.coordinator, cluster.processes, cluster.process_id)
    if None in given and detected() is None:
        raise ConfigError("cluster=multihost found no cluster in the environment (SLURM, Open MPI, Cloud TPU): "
                          "set cluster.coordinator=host:port, cluster.processes and cluster.process_id")
    if None not in given:
        rendezvous(*given, timeout=cluster.timeout)
    jax.distributed.initialize(*given, initialization_timeout=cluster.timeout)


class RendezvousFailed(RuntimeError):
    """The run's processes did not all meet at the coordinator within cluster.timeout, in one line."""


def rendezvous(coordinator: str, processes: int, process_id: int, timeout: float) -> None:
    """Meet every process of the run at the coordinator's address before jax.distributed.initialize does.

    JAX's own rendezvous aborts the process from C++ (SIGABRT and a stack
    dump) when a peer does not arrive within its timeout, where Python can
    neither report it in one line nor give the run directory back. This one is
    plain TCP on the same port, before JAX binds it: process 0 listens and
    counts the others as they connect, and when all have, tells each to go on,
    so JAX's rendezvous then finds every process there. Raises RendezvousFailed.
    """
    if processes <= 1:
        return
    host, port = coordinator.rsplit(":", 1)
    late = (f"within cluster.timeout={timeout} s: start every process with the same cluster.coordinator and "
            "cluster.processes, or raise cluster.timeout")
    if process_id == 0:
        _gather(int(port), processes, time.monotonic() + timeout, f"cluster.coordinator={coordinator}", late)
    else:
        _join(host.strip("[]"), int(port), process_id, timeout, f"cluster.coordinator={coordinator}", late)


def _gather(port: int, processes: int, deadline: float, where: str, late: str) -> None:
    """Process 0's side: accept every other process's rank, then answer each `go` (or `abort` at the deadline)."""
    try:
        server = (socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
                  if socket.has_dualstack_ipv6() else socket.create_server(("", port)))
    except OSError as e:
        raise RendezvousFailed(f"{where}: process 0 cannot listen on port {port} ({e.strerror}): choose a free "
                               "port") from None
    joined: dict[int, socket.socket] = {}
    with server:
        while len(joined) < processes - 1:
            left = deadline - time.monotonic()
            if left <= 0:
                _answer(joined, b"abort\n")
                missing = ", ".join(str(r) for r in range(1, processes) if r not in joined)
                raise RendezvousFailed(f"{where}: {len(joined) + 1} of {processes} processes joined (missing: "
                                       f"process_id {missing}) {late}")
            server.settimeout(left)
            try:
                conn, _ = server.accept()
                conn.settimeout(max(deadline - time.monotonic(), 0.1))
                rank = int(_line(conn))
            except (OSError, ValueError):  # the accept timed out, or a connection that sent no rank
                continue
            if 0 < rank < processes and rank not in joined:
                joined[rank] = conn
            else:
                conn.close()
        _answer(joined, b"go\n")


def _answer(joined: dict[int, socket.socket], word: bytes) -> None:
    """Tell every joined process `word`, and wait for it to hang up first (so the port JAX binds next is free)."""
    for conn in joined.values():
        with conn:
            try:
                conn.sendall(word)
                conn.settimeout(5)
                conn.recv(1)
            except OSError:
                pass


def _join(host: str, port: int, process_id: int, timeout: float, where: str, late: str) -> None:
    """Another process's side: connect (retrying until process 0 listens), send the rank, wait for the verdict."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=max(min(deadline - time.monotonic(), 2), 0.1))
            break
        except OSError:
            if time.monotonic() > deadline:
                raise RendezvousFailed(f"{where}: process {process_id} found no process 0 listening {late}") from None
            time.sleep(0.2)
    with conn:
        try:
            conn.settimeout(timeout)  # process 0 answers once all have joined, or at its own deadline
            conn.sendall(f"{process_id}\n".encode())
            answer = _line(conn)
        except OSError:
            answer = ""
    if answer != "go":
        raise RendezvousFailed(f"{where}: process {process_id} joined, but not all processes did {late}")


def _line(conn: socket.socket) -> str:
    """One short line from a connection ("" if it closes first)."""
    data = b""
    while not data.endswith(b"\n") and len(data) < 64:
        chunk = conn.recv(64)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


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
