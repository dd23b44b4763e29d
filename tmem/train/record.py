"""A run's curve on disk, whatever the logger: `metrics.jsonl` in the run directory.

One JSON object per line, written as it is logged and flushed at once, so a
killed run keeps every line it logged. A line is a training log
(`{"step", "wall_seconds", "lr", "train/loss", "train/accuracy", ...}`: means
over the steps since the last log) or a held-out evaluation (`{"step",
"wall_seconds", "lr", "eval/loss", "eval/accuracy", ...}`), with the keys
wandb gets: `step` the optimizer step, `wall_seconds` the run's training
time (earlier sessions of a resumed run included), `lr` the schedule's rate
at that step. A diverged run's NaN is written as `NaN`, which Python's json
reads back.

A resumed run continues from a checkpoint, so the lines past it describe
steps the run no longer holds: `MetricsFile` drops them (one atomic rewrite)
before it appends, and the file always describes the run's own history.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

METRICS = "metrics.jsonl"


class MetricsFile:
    """Appends a run's logged metrics to `<run dir>/metrics.jsonl`, after dropping the lines past `step`, the
    step the run continues from (0 for a run that starts afresh)."""

    def __init__(self, run_dir: Path, step: int):
        self.path = Path(run_dir) / METRICS
        kept = [line for line in read_metrics(self.path) if line["step"] <= step]
        if self.path.exists():
            write_atomically(self.path, "".join(json.dumps(line) + "\n" for line in kept))
        self._file = open(self.path, "a")

    def write(self, step: int, values: dict) -> None:
        self._file.write(json.dumps({"step": step, **values}) + "\n")
        self._file.flush()  # a killed process loses nothing it logged: the OS holds what was flushed

    def close(self) -> None:
        self._file.close()


def read_metrics(path: Path) -> list[dict]:
    """The lines of a metrics file (or of `<dir>/metrics.jsonl` for a run directory), in order; [] when there is
    none. A last line cut short (the process killed while writing it) is left out; any other bad line raises."""
    path = Path(path)
    path = path / METRICS if path.is_dir() else path
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i < len(lines) - 1:
                raise ValueError(f"{path}: line {i + 1} is not JSON: {line[:80]!r}") from None
    return out


def write_atomically(path: Path, text: str) -> None:
    """`path` holds `text`, or, if the process dies on the way, what it held before."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)
