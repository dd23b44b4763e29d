"""MAD's score from finished jobs: the best job of the lr x weight-decay grid per setting, then means.

MAD (mad-lab `mad/analysis.py`) keeps, for every setting, the grid job with
the highest test accuracy (its class-macro accuracy, tmem's
`eval/macro_accuracy`, measured at the end of training), averages those over
a task's settings to get the task's score, and reports the mean over tasks
too. A job without the metric (one that failed before its first test, or
whose metric is NaN) is dropped, as MAD drops rows with NaNs.

Jobs live at `<out>/<task>/<setting>/<launch>/<job>` (tmem.sweeps.mad writes
them so), which is how a job's task and setting are read back.
"""

from __future__ import annotations

import math
from pathlib import Path

from tmem.sweeps.command import to_csv
from tmem.sweeps.gather import mark_best
from tmem.sweeps.runs import find_runs, read_each, read_job

METRIC = "eval/macro_accuracy"
SETTING_COLUMNS = ["task", "setting", "score", "lr", "weight_decay", "accuracy", "status", "steps", "jobs",
                   "wall_seconds", "run_dir"]


def read_jobs(out: str | Path, metric: str = METRIC) -> list[dict]:
    """One row per finished job under `out`: its task and setting (from where it lies), grid point and score.

    A damaged job is named on stderr and skipped, as a job that never finished.
    """
    out = Path(out)

    def row(run_dir: Path) -> dict:
        given, summary = read_job(run_dir)
        task, setting = run_dir.relative_to(out).parts[:2]
        return {"task": task, "setting": setting, "score": finite(summary.get(metric)),
                "lr": given.get("optim.lr"), "weight_decay": given.get("optim.weight_decay"),
                "accuracy": summary.get("eval/accuracy"), "status": summary.get("status"),
                "steps": summary.get("steps"), "wall_seconds": summary.get("wall_seconds"), "run_dir": str(run_dir)}

    # only <task>/<setting>/<launch>/<job>: any other run under `out` is not the protocol's
    return read_each([r for r in find_runs([out]) if len(r.relative_to(out).parts) == 4], row)


def finite(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def best_per_setting(rows: list[dict]) -> dict[tuple[str, str], dict]:
    """(task, setting) -> its best job (highest score); marks each row's `best` and each best row's `jobs`."""
    best = mark_best(rows, group=lambda r: (r["task"], r["setting"]), value=lambda r: r["score"],
                     higher=lambda r: True)
    for key, row in best.items():
        row["jobs"] = sum((r["task"], r["setting"]) == key for r in rows)
    return best


def task_scores(best: dict[tuple[str, str], dict]) -> dict[str, float]:
    """Each task's MAD score: the mean of its settings' best scores."""
    per_task: dict[str, list[float]] = {}
    for (task, _), row in best.items():
        per_task.setdefault(task, []).append(row["score"])
    return {task: sum(v) / len(v) for task, v in per_task.items()}


def mean_score(scores: dict[str, float]) -> float | None:
    """The mean over tasks (MAD's last line), None for no tasks."""
    return sum(scores.values()) / len(scores) if scores else None


def ordered(best: dict[tuple[str, str], dict], order: list[tuple[str, str]] = ()) -> list[dict]:
    """The best rows in the protocol's order (task, then baseline and changes), unknown ones after, sorted."""
    rank = {key: i for i, key in enumerate(order)}
    tasks = list(dict.fromkeys(t for t, _ in order))
    return [best[k] for k in sorted(best, key=lambda k: (k not in rank, rank.get(k, 0),
                                                         tasks.index(k[0]) if k[0] in tasks else len(tasks), k))]


def markdown(title: str, scores: dict[str, float], rows: list[dict], expected: dict[str, int] | None = None,
             notes: list[str] = ()) -> str:
    """MAD's score table (per task and the mean), then each setting's best job, as Markdown."""
    expected = expected or {}
    lines = [f"# {title}", "", *notes, *([""] if notes else []),
             "| task | settings | MAD score (macro accuracy) |", "|---|---|---|"]
    for task in list(dict.fromkeys(r["task"] for r in rows)):
        n = sum(r["task"] == task for r in rows)
        of = f"{n} of {expected[task]}" if task in expected else f"{n}"
        lines.append(f"| {task} | {of} | {scores[task]:.3f} |")
    total = mean_score(scores)
    lines += [f"| **mean over tasks** | {len(rows)} | **{total:.3f}** |" if total is not None else "", "",
              "| task | setting | best macro accuracy | token accuracy | lr | weight decay | steps | status | jobs |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        acc = "" if r["accuracy"] is None else f"{r['accuracy']:.3f}"
        lines.append(f"| {r['task']} | {r['setting']} | {r['score']:.3f} | {acc} | {r['lr']} | {r['weight_decay']} "
                     f"| {r['steps']} | {r['status']} | {r['jobs']} |")
    return "\n".join(lines) + "\n"


def write_tables(out: Path, title: str, rows: list[dict], order: list[tuple[str, str]] = (),
                 expected: dict[str, int] | None = None, notes: list[str] = ()) -> tuple[dict, str]:
    """Score the jobs and write jobs.csv, mad_settings.csv, mad_scores.csv and mad_scores.md under `out`.

    Returns the task scores and the Markdown text.
    """
    table = ordered(best_per_setting(rows), order)
    scores = task_scores({(r["task"], r["setting"]): r for r in table})  # in the table's task order
    text = markdown(title, scores, table, expected, notes)
    out.mkdir(parents=True, exist_ok=True)
    (out / "jobs.csv").write_text(to_csv(rows, [*SETTING_COLUMNS[:7], "steps", "wall_seconds", "best", "run_dir"]))
    (out / "mad_settings.csv").write_text(to_csv(table, SETTING_COLUMNS))
    tasks = [{"task": t, "settings": sum(r["task"] == t for r in table), "score": s} for t, s in scores.items()]
    tasks.append({"task": "mean", "settings": len(table), "score": mean_score(scores)})
    (out / "mad_scores.csv").write_text(to_csv(tasks, ["task", "settings", "score"]))
    (out / "mad_scores.md").write_text(text)
    return scores, text
