"""Checkpoints with orbax: one step folder per save, verified by checksums, read one step at a time.

Each step is written by orbax's `save_checkpointables` (into a temporary
folder renamed when complete, so a save cut short leaves no step) with the
train state as its one checkpointable and, in orbax's per-step metadata, a
SHA-256 checksum of every array, the held-out metrics and the run's resolved
config. So any one intact step rebuilds its model alone, and a damaged step
never blocks the others.

A step is intact when orbax reads it into the expected shapes and every array
matches its checksum. Damage (a file truncated, deleted or changed on disk) is
told apart from a config change (the step reads as saved, in other shapes).
orbax's training `Checkpointer` is not used: it reads every step's metadata
when it starts, so one damaged file stops every save, and its retention
deletes the older step before anything checks the new one.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np
from orbax.checkpoint import v1 as ocp

from tmem.train.cluster import barrier, is_primary
from tmem.train.mesh import data_mesh, replicated
from tmem.train.step import TrainState

# orbax's layout: a finished step holds FINISHED, a step being written is a folder named <step>TMP_SUFFIX...
FINISHED, TMP_SUFFIX = "_CHECKPOINT_METADATA", ".orbax-checkpoint-tmp"
STATE = "state"  # the step's one checkpointable
log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A run directory whose checkpoints cannot be read or written, in one line."""


class Damaged(CheckpointError):
    """One step's files cannot be read, or no longer match their checksums."""


def checksums(state: Any) -> dict[str, str]:
    """SHA-256 of each array of a pytree (its dtype, shape and bytes), keyed by the array's path."""
    out = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(jax.device_get(state)):
        array = np.ascontiguousarray(leaf)
        digest = hashlib.sha256(f"{array.dtype}{array.shape}".encode())
        digest.update(array.tobytes())
        out[jax.tree_util.keystr(path)] = digest.hexdigest()
    return out


class Checkpoints:
    """The run's `checkpoints/` folder.

    `keep=None` keeps every checkpoint (probes of formation read them all);
    otherwise the newest `keep`, and an older step is deleted only after the
    new one has been read back and checked. A step restores replicated over
    `mesh` (default: every visible device, the mesh a run here trains on),
    whatever layout saved it.
    """

    def __init__(self, directory: Path, *, config: dict | None = None, keep: int | None = None,
                 mesh: jax.sharding.Mesh | None = None):
        self.directory = Path(directory).absolute()  # orbax refuses relative paths
        self._config, self._keep, self._mesh = config, keep, mesh

    # -- reading ------------------------------------------------------------

    def steps(self) -> list[int]:
        """The finished steps on disk, oldest first."""
        if not self.directory.is_dir():
            return []
        return sorted(int(p.name) for p in self.directory.iterdir() if p.name.isdigit() and (p / FINISHED).is_file())

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def metrics(self, step: int) -> dict:
        """The held-out metrics saved with a step; {} (with a warning) when its metadata cannot be read."""
        metadata = self._metadata(step, warn=True) or {}
        legacy = self.directory / str(step) / "metrics" / "metrics"  # where orbax's training Checkpointer kept them
        if "metrics" not in metadata and legacy.is_file():
            try:
                return dict(json.loads(legacy.read_text()) or {})
            except (OSError, ValueError) as e:
                log.warning(f"{legacy} cannot be read [{type(e).__name__}]; step {step}'s metrics are unknown")
        return dict(metadata.get("metrics") or {})

    def config(self) -> dict | None:
        """The resolved config the run saved with its newest readable step."""
        for step in reversed(self.steps()):
            config = (self._metadata(step) or {}).get("config")
            if config is not None:
                return config
        return None

    def restore(self, abstract: TrainState, step: int | None = None) -> TrainState:
        """A step (default the latest) in the shapes of `abstract`, replicated over the mesh.

        Damage is one CheckpointError naming the step, what is wrong and the
        newest intact step; nothing falls back silently.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        if step not in self.steps():
            raise CheckpointError(f"no checkpoint at step {step} in {self.directory}; have steps {self.steps()}")
        try:
            return self._load(step, abstract)
        except Damaged as e:
            intact = self._newest_intact(abstract, below=step)
            hint = (f"the newest intact step is {intact} (eval.py ... step={intact}; a resume uses it)"
                    if intact is not None else "no older step is intact")
            raise Damaged(f"{e}; {hint}") from e

    def resume(self, abstract: TrainState) -> TrainState | None:
        """The newest intact step (None if there is no step), for a run that continues.

        A damaged newer step gets one warning line and is moved aside (renamed
        `<step>.damaged`, never deleted), so the run goes on from the step
        before it and its later saves do not meet the damaged folder.
        """
        for step in reversed(self.steps()):
            try:
                return self._load(step, abstract)
            except Damaged as e:
                aside = self._move_aside(step)
                log.warning(f"resume: {e}; moved it to {aside.name} and trying the step before it")
        if any(".damaged" in p.name for p in self.directory.glob("*")):
            raise CheckpointError(f"no intact checkpoint in {self.directory}: every step was damaged (moved "
                                  "aside as <step>.damaged); start a new run in another hydra.run.dir")
        return None

    def _load(self, step: int, abstract: TrainState) -> TrainState:
        # Without a sharding on the target, orbax recreates the saving host's
        # device layout and fails elsewhere (a GPU checkpoint on a CPU host, 2 devices' on 1).
        if self._mesh is None:  # made on the first read: a Checkpoints that only reads metadata starts no backend
            self._mesh = data_mesh()
        whole = replicated(self._mesh)
        target = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=whole), abstract)
        folder = self.directory / str(step)
        try:
            with _quiet():
                state = ocp.load(folder, target, checkpointable_name=STATE)
        except Exception as e:  # orbax raises many types; keep the cause chained
            raise self._why_not(step, e) from e
        metadata = self._metadata(step)
        if metadata is None:
            raise Damaged(f"step {step} in {self.directory} cannot be verified: {folder / FINISHED}, which holds "
                          "its checksums, cannot be read")
        saved = metadata.get("checksums")
        if saved is None:  # orbax wrote it, tmem did not checksum it: a run from before checksums, or another tool's
            log.warning(f"step {step} in {self.directory} carries no checksums (saved before tmem verified "
                        "checkpoints): restored unverified")
            return state
        bad = [path for path, digest in checksums(state).items() if saved.get(path) != digest]
        if bad:
            raise Damaged(f"step {step} in {self.directory} is damaged: {len(bad)} of {len(saved)} arrays no longer "
                          f"match the checksums saved with them (first: state{bad[0]}); its files changed on disk")
        return state

    def _why_not(self, step: int, error: Exception) -> CheckpointError:
        """A config change if the step reads as it was saved, else damage on disk."""
        cause = f"[{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:160]}]"
        try:
            with _quiet():
                ocp.load(self.directory / str(step), checkpointable_name=STATE)  # no target: the tree as saved
        except Exception:
            return Damaged(f"step {step} in {self.directory} is damaged: its files cannot be read {cause}")
        return CheckpointError(f"cannot restore step {step} from {self.directory}: its saved state does not fit this "
                               f"config (was the model or optimizer config changed since?) {cause}")

    def _intact(self, step: int, abstract: TrainState) -> bool:
        try:
            self._load(step, abstract)
            return True
        except CheckpointError:
            return False

    def _newest_intact(self, abstract: TrainState, below: int) -> int | None:
        return next((s for s in reversed(self.steps()) if s < below and self._intact(s, abstract)), None)

    def _metadata(self, step: int, warn: bool = False) -> dict | None:
        """The custom metadata orbax keeps in a step's finished-marker file (None when it cannot be read).

        Read as the JSON it is, not through `ocp.metadata`, which also reads the
        state's own metadata and so fails on damage this file does not share.
        """
        path = self.directory / str(step) / FINISHED
        try:
            return dict(json.loads(path.read_text()).get("custom_metadata") or {})
        except (OSError, ValueError, AttributeError) as e:
            if warn:
                log.warning(f"{path} cannot be read [{type(e).__name__}]; step {step}'s metrics are unknown")
            return None

    def _move_aside(self, step: int) -> Path:
        """Rename a step `<step>.damaged`: process 0's rename, once every process has stopped reading it."""
        folder = self.directory / str(step)
        aside = folder.with_name(f"{step}.damaged")
        if aside.exists():
            aside = folder.with_name(f"{step}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        barrier("tmem-checkpoint-move-aside")
        if is_primary():
            folder.rename(aside)
        barrier("tmem-checkpoint-moved-aside")
        return aside

    # -- writing ------------------------------------------------------------

    def save(self, state: TrainState, metrics: dict | None = None) -> None:
        """Save, read back and check the state's step, then drop the steps beyond `keep`.

        A step already on disk with the same arrays (the final save after a
        periodic one) is left as it is; a different one at that step (damaged,
        or from a state the run went back on) is moved aside first.
        """
        step, sums, abstract = int(state.step), checksums(state), jax.eval_shape(lambda: state)
        folder = self.directory / str(step)
        if folder.exists():
            if (self._metadata(step) or {}).get("checksums") == sums and self._intact(step, abstract):
                return
            log.warning(f"step {step} in {self.directory} holds other or damaged arrays; moved it to "
                        f"{self._move_aside(step).name} before saving this run's step {step}")
        metadata = {"checksums": sums, "metrics": _jsonable(metrics), "config": self._config}
        if is_primary():  # of a multi-process run, one process does the file work; orbax saves from all together
            self.directory.mkdir(parents=True, exist_ok=True)
            self._discard_partial(step)  # left by a process killed while saving; the run directory is ours alone
        barrier("tmem-checkpoint-save")
        try:
            ocp.save_checkpointables(folder, {STATE: state}, custom_metadata=metadata)
        except Exception as e:
            if is_primary():
                self._discard_partial(step)
            raise CheckpointError(self._save_failed(step, e)) from e
        try:
            self._load(step, abstract)
        except CheckpointError as e:
            aside = self._move_aside(step)
            raise CheckpointError(f"step {step} was written but does not read back ({e}); moved it to {aside.name}; "
                                  f"the earlier steps {self.steps()} are kept") from e
        if self._keep is not None and is_primary():
            for old in self.steps()[:-self._keep]:
                shutil.rmtree(self.directory / str(old))

    def _save_failed(self, step: int, error: Exception) -> str:
        kept = [s for s in self.steps() if s != step]
        previous = f"the earlier steps {kept} are intact" if kept else "no earlier step was saved"
        if _is_errno(error, errno.ENOSPC):
            return (f"cannot save step {step} in {self.directory}: no space left on device; {previous}. "
                    "Free space, then continue with train.resume=true")
        return f"cannot save step {step} in {self.directory} [{type(error).__name__}: {error}]; {previous}"

    def _discard_partial(self, step: int) -> None:
        """orbax writes into a temporary folder beside the step; a failed or killed save leaves it half written."""
        for partial in self.directory.glob(f"{step}{TMP_SUFFIX}*"):
            shutil.rmtree(partial, ignore_errors=True)


@contextlib.contextmanager
def _quiet():
    """orbax's own logs and warnings about a step it cannot read: the one line tmem prints names the damage."""
    _drop_late_read_errors()
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        absl.setLevel(level)


def _drop_late_read_errors() -> None:
    """Silence what a failed orbax read leaves behind (installed once, at the first read).

    orbax runs a step's reads in an event loop it closes without cancelling
    them when one read fails (asyncio_utils._run_sync_via_new_loop). The other
    reads of the step then end as they may: each finishing read reports to the
    closed loop ("Event loop is closed", unraisable), a task, future or
    gathering fails that nobody awaits (asyncio's "... exception was never
    retrieved" log naming an orbax coroutine or tensorstore's read), a
    coroutine was never awaited, or, once the garbage collector gets to a read
    still pending in the closed loop, often many reads later, closing it raises from orbax's own `except BaseException` (an unraisable
    "Exception ignored in: <coroutine ...>" whose code is orbax's). Dozens of
    these would bury the one line that names the damage; any other error still
    prints.
    """
    previous = sys.unraisablehook
    if getattr(previous, "__name__", "") == "_late_read_error":
        return

    def _late_read_error(unraisable):
        closed = isinstance(unraisable.exc_value, RuntimeError) and str(unraisable.exc_value) == "Event loop is closed"
        code = getattr(unraisable.object, "cr_code", None)  # a coroutine's code, where it is one
        if not (closed or (code is not None and "orbax" in Path(code.co_filename).parts)):
            previous(unraisable)

    sys.unraisablehook = _late_read_error
    warnings.filterwarnings("ignore", message="coroutine .* was never awaited", category=RuntimeWarning)
    logging.getLogger("asyncio").addFilter(lambda record: not _orphaned_read(record.getMessage()))


def _orphaned_read(message: str) -> bool:
    """asyncio's log of a task, future or gathering of futures that failed with nobody awaiting it, where the
    failure is one of orbax's reads (an orbax coroutine, or tensorstore's error naming the OCDBT database or
    the TensorStore it read)."""
    first, _, rest = message.partition("\n")
    return first.endswith("exception was never retrieved") and any(
        mark in rest for mark in ("orbax", "OCDBT database", "TensorStore"))


def _is_errno(error: BaseException | None, code: int) -> bool:
    """Whether an OSError with this errno is the error or anywhere in its chain of causes."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno == code:
            return True
        error = error.__cause__ or error.__context__
    return False


def _jsonable(metrics: dict | None) -> dict[str, Any] | None:
    return None if metrics is None else {k: (None if v is None else float(v)) for k, v in metrics.items()}
