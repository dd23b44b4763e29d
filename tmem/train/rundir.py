"""The run directory: claimed once, before anything is written in it, and continued only by a resume of the same run.

Hydra creates the output directory, writes `.hydra/` and opens `train.log`
before `train.py`'s function runs, so the checks that decide whether a command
may write there run first, in `prepare`, on the command line: it composes and
validates the config, claims the directory with an exclusive-create marker
(`.tmem-run`, locked for as long as the process trains), and hands Hydra back
the command line with that directory pinned. A resume is checked against the
config the run saved, and Hydra writes no new `.hydra/` record for it, so the
record keeps describing how the run started.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf, open_dict

from tmem.command import check_group_overrides, compose_command, overrides_of
from tmem.config import CONFIG_DIR, ConfigError, saved_form, validate, with_new_fields
from tmem.mixers import config_type
from tmem.mixers.base import resumable_fields
from tmem.mixers.migrate import migrate_config
from tmem.train.record import METRICS
from tmem.train.resolved import RESOLVED

CLAIM = ".tmem-run"  # created exclusively by the command that starts a run; it holds who and when
RUN_FILES = (CLAIM, "summary.json", "checkpoints", ".hydra/config.yaml")  # any of them: the directory holds a run
# What a resume may change: how long and how often, where it is tracked, on how many hosts, and the slice of the
# batch differentiated at once (the same update to float rounding), and the mixer's fields its row marks
# resumable (tmem.mixers.base.resumable: how it computes the same function). Everything else (task, model, mixer,
# MLP, optimizer, seed, batch) is the run itself; changing it is a new run.
RESUMABLE = ("train.steps", "train.stop_after", "train.log_every", "train.eval_every", "train.checkpoint_every",
             "train.keep_checkpoints", "train.target", "train.early_stop", "train.resume", "train.diverge_factor",
             "train.diverge_patience", "logger.", "name", "cluster.", "train.microbatch")
# Hydra's flags that print something and run nothing
INSPECT = {"-h", "--help", "--hydra-help", "-c", "--cfg", "-i", "--info", "-p", "--package", "--version", "-sc",
           "--shell-completion"}
_held: list[int] = []  # file descriptors of the claims this process holds locked (closed when it exits)
# each directory this process claimed for a new run -> (the names it held before, None if it did not exist; the
# claim's locked descriptor), so `release` gives back only its own claims, and only what they added
_claimed: dict[Path, tuple[frozenset[str] | None, int]] = {}


def prepare(args: list[str], config_dir: Path = CONFIG_DIR) -> list[str]:
    """A train.py command line checked, its output directory claimed, and that directory pinned in it.

    Raises ConfigError with one line when the command must not run: a bad
    config, an output directory that is a file or already holds a run (unless
    the command resumes it), or a resume that changes more than RESUMABLE.
    """
    if INSPECT & set(args):
        return args  # Hydra prints and exits; no run starts
    problem = check_group_overrides(args, config_dir)
    if problem:
        raise ConfigError(problem)
    given = {key: str(values[-1]) for key, values in overrides_of(args)
             if key in ("hydra.run.dir", "hydra.sweep.dir") and values}
    for key, value in given.items():
        if Path(value).exists() and not Path(value).is_dir():
            raise ConfigError(f"{key}={value} is a file, not a directory: choose another {key}")
    resume = any(key == "train.resume" and values == [True] for key, values in overrides_of(args))
    extra = ["hydra.output_subdir=null"] if resume else []  # a resume leaves the run's .hydra record as it started
    if {"-m", "--multirun"} & set(args):
        composed = compose_command(args, config_dir=config_dir, sweeps=False)
        sweep_dir = Path(composed.hydra.sweep.dir)
        if _rank(composed) != 0:
            return _follower(args, "hydra.sweep.dir", given)
        if "hydra.sweep.dir" in given:
            if not resume and sweep_dir.is_dir() and any(sweep_dir.iterdir()):
                raise ConfigError(f"hydra.sweep.dir={sweep_dir} already holds a sweep: continue its jobs with "
                                  "train.resume=true, or choose another hydra.sweep.dir")
        else:
            sweep_dir = _first_free(sweep_dir, lambda d: d.mkdir(parents=True))
        return _pinned(args, "hydra.sweep.dir", sweep_dir) + extra
    composed = compose_command(args, config_dir=config_dir)
    run_dir = Path(composed.hydra.run.dir)
    with open_dict(composed):
        del composed["hydra"]  # what train.py's function receives; Hydra's own section needs a running job
    validate(composed)
    if _rank(composed) != 0:
        return _follower(args, "hydra.run.dir", given)
    resolved = saved_form(composed)
    if resume and holds_run(run_dir):
        check_resume(run_dir, resolved)
        lock(run_dir)
        return _pinned(args, "hydra.run.dir", run_dir) + extra
    if "hydra.run.dir" in given:
        claim(run_dir)
    else:  # the default, a timestamp: two runs started in one second take the next free name
        run_dir = _first_free(run_dir, claim)
    return _pinned(args, "hydra.run.dir", run_dir) + extra


def _rank(composed) -> int:
    """This process's rank in a multi-process run (cluster=multihost), 0 in a run of one process."""
    from tmem.config import parse_group
    from tmem.schema import ClusterConfig
    from tmem.train.cluster import process_id

    return process_id(parse_group("cluster", ClusterConfig, composed.cluster) if "cluster" in composed
                      else ClusterConfig())


def _follower(args: list[str], key: str, given: dict) -> list[str]:
    """The command line of a process other than rank 0 of a multi-process run: it claims and records nothing.

    Rank 0 claims the directory and checks a resume; every process must name
    the same directory, which a timestamp each process takes for itself would not.
    Its log goes to its own console only: train.log is rank 0's.
    """
    if key not in given:
        raise ConfigError(f"cluster=multihost: every process of a run writes to one directory, and each would "
                          f"take its own timestamp: give {key} (the same on every process)")
    return _pinned(args, key, Path(given[key])) + ["hydra.output_subdir=null",
                                                   "hydra.job_logging.root.handlers=[console]"]


def holds_run(run_dir: Path) -> bool:
    return any((Path(run_dir) / f).exists() for f in RUN_FILES)


def claim(run_dir: Path, *, hydra_wrote: bool = False) -> None:
    """Make `run_dir` this process's run: one exclusive create, so of two racing commands one wins.

    `hydra_wrote`: a sweep's job, whose `.hydra/` Hydra writes before the job
    can claim it (in a sweep directory `prepare` claimed fresh). A claim left
    by a command that died before its run had a checkpoint or a summary
    (killed, or aborted where Python could not give the directory back) is
    taken over: nothing of a run is there, and nobody holds its lock.
    """
    run_dir = Path(run_dir)
    refused = ConfigError(f"hydra.run.dir={run_dir} already holds a run: continue it with train.resume=true, "
                          "or choose another hydra.run.dir")
    fd = None
    if not hydra_wrote and holds_run(run_dir):
        fd = _take_abandoned(run_dir)
        if fd is None:
            raise refused
        _remove_written(run_dir, existed=frozenset(), claim=False)  # what the dead command wrote, its marker now ours
        os.ftruncate(fd, 0)
    existed = frozenset(p.name for p in run_dir.iterdir()) - {CLAIM} if run_dir.is_dir() else None
    if fd is None:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = _new_claim(run_dir)
        if fd is None:
            raise refused
    claimed = {"host": socket.gethostname(), "pid": os.getpid(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    os.write(fd, (json.dumps(claimed) + "\n").encode())
    _held.append(fd)
    _claimed[run_dir.absolute()] = (existed, fd)


def _new_claim(run_dir: Path) -> int | None:
    """The claim marker of `run_dir`, created already locked by this process, or None if it exists.

    Made under a name of this process's own, locked, then linked to the marker's name (a link, like an exclusive
    create, fails where the name exists): no other process ever sees the marker unlocked, which it would take
    for a claim abandoned by a dead command (`_take_abandoned`) and so win the race too.
    """
    private = run_dir / f"{CLAIM}.{socket.gethostname()}.{os.getpid()}"
    # no O_EXCL: the name is this process's alone, and one left by a dead process with the same pid is stale
    fd = os.open(private, os.O_CREAT | os.O_TRUNC | os.O_WRONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody else has the file: this cannot block
    try:
        os.link(private, run_dir / CLAIM)
    except FileExistsError:
        os.close(fd)
        return None
    finally:
        os.unlink(private)
    return fd


def _take_abandoned(run_dir: Path) -> int | None:
    """The claim marker of `run_dir` locked by this process, if its command died before the run started (no
    checkpoint, no summary, and nobody holds the lock); else None."""
    if not (run_dir / CLAIM).is_file() or _has_results(run_dir):
        return None
    fd = os.open(run_dir / CLAIM, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:  # its command is alive: still starting, or training
        os.close(fd)
        return None


def _has_results(run_dir: Path) -> bool:
    """A summary, or a checkpoints folder holding anything (a step, finished, partial or moved aside as damaged)."""
    steps = run_dir / "checkpoints"
    return (run_dir / "summary.json").exists() or (steps.is_dir() and any(steps.iterdir()))


def release(run_dir: Path) -> None:
    """Give back a directory this process claimed for a run that never started: the command failed before the
    run had a checkpoint or a summary (a late config error, a failed rendezvous, an error building or compiling,
    a first save that failed).

    What the claim, Hydra and the run's first moments wrote goes (the marker,
    `.hydra/`, the job's log, the resolved record, the metrics file, an empty
    checkpoints folder, the wandb files),
    so the same command can run again; anything that was there before the
    claim stays. A run with a checkpoint or a summary stays as it is, and so
    does a directory this process did not claim (a resumed run).
    """
    key = Path(run_dir).absolute()
    if key not in _claimed or _has_results(key):
        return
    existed, fd = _claimed.pop(key)
    _remove_written(key, existed)
    _held.remove(fd)
    os.close(fd)


def _remove_written(run_dir: Path, existed: frozenset[str] | None, claim: bool = True) -> None:
    """Remove what a claimed run writes before its first checkpoint, except what was there before the claim
    (`existed`: the names the directory held; None: it did not exist, so it goes too once empty)."""
    for name in ((CLAIM,) if claim else ()) + (".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml",
                                                "train.log", RESOLVED, METRICS):
        (run_dir / name).unlink(missing_ok=True)
    for name in ("wandb", "checkpoints"):
        if name not in (existed or ()) and (run_dir / name).is_dir():
            shutil.rmtree(run_dir / name, ignore_errors=True)
    for folder in (run_dir / ".hydra", *([run_dir] if existed is None else [])):
        try:
            folder.rmdir()
        except OSError:  # missing, or holding something this process did not write
            pass


def lock(run_dir: Path) -> None:
    """Hold an existing run for this process (a resume): refused while another process trains it."""
    fd = os.open(Path(run_dir) / CLAIM, os.O_CREAT | os.O_RDWR)  # a run made before claims existed gets one
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(f"hydra.run.dir={run_dir} is being trained by another process ({run_dir / CLAIM} says "
                          "which): wait for it to finish, then resume") from None
    _held.append(fd)


def saved_config(run_dir: Path) -> dict | None:
    """The resolved config a run saved: with its newest readable checkpoint, else Hydra's record of its start;
    in today's field names (tmem.mixers.migrate: a run saved before its row's recipe and run were parts), with
    the fields added since at their defaults (tmem.config.with_new_fields)."""
    from tmem.train.checkpoint import Checkpoints  # orbax loads slowly; only a resume needs it

    saved = Checkpoints(Path(run_dir) / "checkpoints").config()
    record = Path(run_dir) / ".hydra" / "config.yaml"
    if saved is None and record.is_file():
        # a hybrid's entries written out as a checkpoint holds them
        return with_new_fields(saved_form(OmegaConf.create(migrate_config(OmegaConf.to_container(
            OmegaConf.load(record))))))
    return None if saved is None else with_new_fields(migrate_config(saved))


def check_resume(run_dir: Path, resolved: dict) -> None:
    """ConfigError unless `resolved` is the saved run's config with only RESUMABLE fields changed."""
    saved = saved_config(run_dir)
    if saved is None:
        raise ConfigError(f"hydra.run.dir={run_dir} holds no config to resume from (no readable checkpoint and no "
                          ".hydra/config.yaml): choose another hydra.run.dir for a new run")
    old, new = _flat(saved), _flat(resolved)
    resumable = RESUMABLE + _mixer_resumable(saved) + _mixer_resumable(resolved)
    changed = [k for k in sorted(old.keys() | new.keys())
               if old.get(k) != new.get(k) and k != "optim.decay_steps"  # compared as the decay's end, below
               and not any(k == f or (f.endswith(".") and k.startswith(f)) for f in resumable)]
    if changed:
        shown = ", ".join(f"{k} ({old.get(k)!r} -> {new.get(k)!r})" for k in changed[:3])
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        raise ConfigError(f"train.resume: this command changes {shown}{more} from the run in {run_dir}; a resume "
                          "may change only the step budget, logging, evaluation, checkpoint cadence, target and "
                          "microbatch (README: Run directories): drop those overrides, or start a new run in "
                          "another hydra.run.dir")
    # after the fields: a changed schedule or model is named as such. A raised train.steps must not move the end of
    # a decay that follows it: the rate would jump mid-run, and the run would no longer be one schedule
    old_end, new_end = (_decay_end(c) for c in (saved, resolved))
    if old_end != new_end:
        raise ConfigError(f"train.resume: this command moves the end of the run's learning-rate decay from step "
                          f"{old_end} to {new_end} (optim.decay_steps, or train.steps where it and the mixer's "
                          f"recommendation are null): keep the run's schedule with optim.decay_steps={old_end}, or "
                          "start a new run in another hydra.run.dir")


def _mixer_resumable(resolved: dict) -> tuple[str, ...]:
    """The mixer fields a resume may change, as each row's config marks them (tmem.mixers.base.resumable): the
    mixer group's, and each hybrid entry's (model.mixers.<i>.<field>, as `_flat` names them)."""
    entries = (resolved.get("model") or {}).get("mixers") or []
    nodes = [("mixer", resolved.get("mixer") or {}),
             *((f"model.mixers.{i}", e) for i, e in enumerate(entries) if isinstance(e, dict))]
    fields = []
    for prefix, node in nodes:
        try:
            schema = config_type(node)
        except ValueError as e:
            raise ConfigError(f"train.resume: {e}") from None
        fields += [f"{prefix}.{name}" for name in resumable_fields(schema)]
    return tuple(fields)


def _decay_end(resolved: dict) -> int | None:
    """Config.decay_end of a resolved config, None for a constant rate (it has no end to move)."""
    try:
        cfg = validate(OmegaConf.create(resolved))
    except ConfigError as e:
        raise ConfigError(f"train.resume: the run's saved config no longer validates: {e}") from None
    return None if cfg.optim.schedule == "constant" else cfg.decay_end


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf by its dotted key; a hybrid's entries by their index (model.mixers.1.window), so a refused
    resume names the one field it changes."""
    if isinstance(tree, list) and tree and all(isinstance(v, dict) for v in tree):
        tree = dict(enumerate(tree))
    if not isinstance(tree, dict):
        return {prefix[:-1]: tree}
    out: dict[str, Any] = {}
    for k, v in tree.items():
        out.update(_flat(v, f"{prefix}{k}."))
    return out


def _first_free(path: Path, take) -> Path:
    """`path`, or `path-1`, `path-2`, ...: the first that `take` (which raises when taken) accepts."""
    for n in range(1000):
        candidate = path if n == 0 else path.with_name(f"{path.name}-{n}")
        try:
            take(candidate)
            return candidate
        except (FileExistsError, ConfigError):
            continue
    raise ConfigError(f"no free directory beside {path}: choose hydra.run.dir or hydra.sweep.dir")


def _pinned(args: list[str], key: str, value: Path) -> list[str]:
    """The command line with `key` set to `value` once: Hydra's own timestamp would differ by the time it runs."""
    return [a for a in args if not a.lstrip("+").startswith(f"{key}=")] + [f"{key}={value}"]
