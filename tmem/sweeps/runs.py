"""A finished run's files as plain Python: its overrides, its summary (nested sections flattened), its budget and its
metrics.jsonl, with damage named rather than raised from deep inside a reader.

No jax here: gathering a sweep reads JSON and YAML only, and starts as fast as any other small command.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

from omegaconf import OmegaConf

from tmem.train.record import METRICS, read_metrics

T = TypeVar("T")


class Damaged(Exception):
    """A job file that cannot be read as what it should be; the message is one line naming the file."""


def natural(text: str) -> tuple:
    """A sort key that puts "2" before "10": Hydra numbers a multirun's jobs, in the order the sweep was typed."""
    return (0, int(text), "") if text.lstrip("-").isdigit() else (1, 0, text)


def find_runs(roots: Iterable[str | Path]) -> list[Path]:
    """Every finished run under the roots (a folder with summary.json beside .hydra/config.yaml), in the
    sweeps' job order."""
    runs = set()
    for root in map(Path, roots):
        for summary in root.rglob("summary.json"):
            if (summary.parent / ".hydra" / "config.yaml").exists():
                runs.add(summary.parent)
    return sorted(runs, key=lambda path: [natural(part) for part in path.parts])


def _yaml(path: Path):
    try:
        return OmegaConf.to_container(OmegaConf.load(path))
    except Exception as e:  # omegaconf and yaml raise several types for a damaged file
        raise Damaged(f"{path}: not YAML ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None


def overrides(run_dir: Path) -> dict[str, str]:
    """A job's command-line overrides as key -> value text (`model.width=64` -> {"model.width": "64"}).

    Hydra records them in .hydra/overrides.yaml, the swept values of a
    multirun's job among them; a run without the file has none.
    """
    path = run_dir / ".hydra" / "overrides.yaml"
    lines = _yaml(path) if path.is_file() else []
    if not isinstance(lines, (list, type(None))):
        raise Damaged(f"{path}: not a list of overrides")
    pairs = (str(line).lstrip("+~").split("=", 1) for line in lines or [])
    return {key: value for key, value, *_ in (pair + [""] for pair in pairs)}


def memory(cfg) -> str:
    """The memory a run's config trains, by name: its mixer, a sliding window's size after it (`softmax w8`), a
    hybrid's layers joined by "+" in stack order (`gated_deltanet+softmax w8`), so that runs of one row whose
    memories differ in kind or size are told apart. A hybrid's layer named by its row alone takes the mixer
    group's knobs where it is the group's row, as training does."""
    def named(layer) -> str:
        if isinstance(layer, str):
            layer = cfg.mixer if layer == cfg.mixer.name else {"name": layer}
        window = layer.get("window")
        return f"{layer['name']} w{window}" if window else str(layer["name"])

    return "+".join(named(layer) for layer in (cfg.model.get("mixers") or [cfg.mixer]))


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """Nested sections as dotted keys ({"recipe": {"lr": 1e-3}} -> {"recipe.lr": 1e-3}); lists are dropped,
    since a CSV cell holds one value."""
    flat = {}
    for k, v in d.items():
        if isinstance(v, dict):
            flat.update(flatten(v, f"{prefix}{k}."))
        elif not isinstance(v, list):
            flat[f"{prefix}{k}"] = v
    return flat


def _json_object(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise Damaged(f"{path}: not JSON ({e})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise Damaged(f"{path}: unreadable ({e})") from None
    if not isinstance(value, dict):
        raise Damaged(f"{path}: not a JSON object")
    return value


def summary(run_dir: Path) -> dict[str, Any]:
    """summary.json flattened into dotted fields; Damaged when it is truncated or not an object."""
    return flatten(_json_object(run_dir / "summary.json"))


REPORT = "eval"  # the folder of eval.py's report on a run read on its own task (eval/<task overrides>: a changed one)
NOT_MEASURED = ("run", "task_overrides", "task", "figures")  # a report's bookkeeping, the same in every seed


def report(run_dir: Path, folder: str = REPORT) -> dict[str, Any]:
    """The probes' numbers in the run's eval report (`python eval.py run=<job> probes=[...]` writes it in
    `folder`) as `report.<probe>.<field>` fields, with `report.step` the checkpoint read: so a probe's result folds
    over a sweep's seeds as its training summary does. {} for a run never evaluated; Damaged when the file is
    cut."""
    path = run_dir / folder / "report.json"
    if not path.is_file():
        return {}
    value = _json_object(path)
    return flatten({k: v for k, v in value.items() if k not in NOT_MEASURED}, "report.")


def read_job(run_dir: Path, report_folder: str = REPORT) -> tuple[dict[str, str], dict[str, Any]]:
    """A job's overrides and its summary's fields (nested sections as dotted fields), then its eval report's."""
    return overrides(run_dir), {**summary(run_dir), **report(run_dir, report_folder)}


def budget(run_dir: Path, fields: dict[str, Any]) -> int | None:
    """The steps a job was allowed: its config's train.steps, or more where a resume raised it (the saved config
    describes how the run started), so the larger of that and the steps it ran."""
    path = run_dir / ".hydra" / "config.yaml"
    cfg = _yaml(path) if path.is_file() else {}
    planned = (cfg.get("train") or {}).get("steps") if isinstance(cfg, dict) else None
    known = [v for v in (planned, fields.get("steps")) if isinstance(v, int) and not isinstance(v, bool)]
    return max(known) if known else None


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl's lines ({"step": ..., "train/loss": ...}), in file order; [] where the run has none.

    The run's own reader (tmem.train.record) leaves out a last line cut by a
    kill; any other line that is not a JSON object with an integer step is
    damage.
    """
    try:
        lines = read_metrics(run_dir)
    except (ValueError, UnicodeDecodeError) as e:
        raise Damaged(str(e)) from None
    for i, line in enumerate(lines, 1):
        if not isinstance(line, dict) or not isinstance(line.get("step"), int):
            raise Damaged(f"{run_dir / METRICS}: line {i} has no integer step")
    return lines


def curve(lines: list[dict[str, Any]], metric: str) -> dict[int, float]:
    """step -> the metric's value, from every line that has it; a step logged twice (a resumed run) keeps the
    last; values that are not finite numbers are left out."""
    points = {}
    for line in lines:
        v = line.get(metric)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            points[line["step"]] = float(v)
    return dict(sorted(points.items()))


def read_each(run_dirs: Iterable[Path], read: Callable[[Path], T]) -> list[T]:
    """`read` of every run that reads; each damaged one is skipped with one line on stderr, then their count."""
    run_dirs, done, damaged = list(run_dirs), [], 0
    for run_dir in run_dirs:
        try:
            done.append(read(run_dir))
        except Damaged as e:
            damaged += 1
            print(f"skipped: {e}", file=sys.stderr)
    if damaged:
        print(f"skipped {damaged} damaged job{'s' if damaged > 1 else ''} of {len(run_dirs)}", file=sys.stderr)
    return done
