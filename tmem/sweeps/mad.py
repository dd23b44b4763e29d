"""MAD's protocol for one mixer: every setting trained over the lr x weight-decay grid, then MAD's score table.

    python -m tmem.sweeps.mad --mixer softmax --reduced             # each task's baseline, short (2-core CPU)
    python -m tmem.sweeps.mad --mixer deltanet                      # MAD's 66 settings x 6 jobs (a GPU's work)
    python -m tmem.sweeps.mad --mixer softmax --tasks compression mixer.heads=8   # a subset; Hydra overrides
    python -m tmem.sweeps.mad --gather-only multirun/mad-reduced/softmax    # score what has finished

Each setting (tmem/sweeps/mad_settings.py: a task's baseline, or the
baseline with one field changed) is one Hydra multirun of train.py with
`experiment=mad` (MAD's recipe: width 128, 2 blocks of mixer + SwiGLU, AdamW,
cosine to about 1e-6) over MAD's grid, lr 1e-4, 5e-4, 1e-3 x weight decay
0, 0.1, in `<out>/<task>/<setting>/launch-<n>/<job>`; train.steps is
200 epochs of the setting's training set at batch 128. Jobs log nothing to
wandb (`logger=disabled`) unless the extra overrides say otherwise; extra
overrides come last and replace the protocol's own.

Then it scores (tmem/sweeps/mad_score.py): the best job of each setting by
`eval/macro_accuracy` (MAD's test metric), the mean over each task's
settings, the mean over tasks; it prints the table and writes
`mad_scores.md`, `mad_scores.csv`, `mad_settings.csv` and `jobs.csv` under
--out. Running the same command again skips every grid point that already
has a finished job and launches only the missing ones (in a new launch-<n>
folder), so an interrupted protocol continues where it stopped; the tables in
the protocol's own folder (marked by its protocol.json) are rewritten each
time, and `--gather-only` into any other folder keeps tables already there
unless --force.

Before anything is launched, the mixer is checked against configs/mixer/ and
every chosen setting's first job is composed and validated as train.py
would (the full protocol's 66 take about 20 s on 2 cores), so a misspelt
mixer or override is one line, not six failed multiruns. A damaged job
(a summary cut short) is named, counted and skipped: its grid point is
trained again.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from tmem.sweeps import mad_score
from tmem.sweeps.command import check_folder, fail
from tmem.sweeps.mad_settings import FULL, REDUCED, TASKS, Plan, Setting, eval_every, settings, train_steps
from tmem.sweeps.runs import find_runs, read_each, read_job

ROOT = Path(__file__).resolve().parents[2]


def job_overrides(setting: Setting, mixer: str, plan: Plan, extra: list[str] = ()) -> list[str]:
    """The Hydra overrides every job of a setting shares (the grid's come separately); `extra` wins."""
    steps = train_steps(setting.fields["train_examples"], setting.epochs, plan.batch_size)
    every = eval_every(setting, plan)
    own = ["experiment=mad", f"task={setting.name}", f"mixer={mixer}",
           *(f"task.{k}={v}" for k, v in setting.fields.items()),
           f"train.batch_size={plan.batch_size}", f"train.steps={steps}", f"train.eval_every={every}",
           f"train.log_every={min(every, 100)}", f"train.checkpoint_every={steps}", "logger=disabled"]
    return merge(own, list(extra))


def key_of(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def merge(own: list[str], extra: list[str]) -> list[str]:
    """`own` without the keys `extra` sets, then `extra`: a user's override replaces the protocol's."""
    given = {key_of(o) for o in extra}
    return [o for o in own if key_of(o) not in given] + extra


def finished_points(setting_dir: Path) -> set[tuple[float, float]]:
    """The (lr, weight decay) grid points that have a finished job in this setting's folder."""
    done = set()
    for given, _ in read_each(find_runs([setting_dir]) if setting_dir.is_dir() else [], read_job):
        if "optim.lr" in given and "optim.weight_decay" in given:
            done.add((float(given["optim.lr"]), float(given["optim.weight_decay"])))
    return done


def missing_points(plan: Plan, done: set[tuple[float, float]]) -> list[tuple[float, float]]:
    """The grid points without a finished job, in grid order."""
    return [(lr, wd) for lr, wd in itertools.product(plan.lrs, plan.weight_decays)
            if not any(math.isclose(lr, a) and math.isclose(wd, b) for a, b in done)]


def launches(missing: list[tuple[float, float]]) -> list[tuple[list[float], list[float]]]:
    """Multiruns that cover exactly the missing points: one when they form a full lr x wd product, else one
    per learning rate (a multirun is a product; a finished point must not be trained again)."""
    lrs, wds = list(dict.fromkeys(p[0] for p in missing)), list(dict.fromkeys(p[1] for p in missing))
    if len(missing) == len(lrs) * len(wds):
        return [(lrs, wds)] if missing else []
    return [([lr], [wd for a, wd in missing if a == lr]) for lr in lrs]


def grid_overrides(lrs: list[float], wds: list[float]) -> list[str]:
    return [f"optim.lr={','.join(f'{v:g}' for v in lrs)}", f"optim.weight_decay={','.join(f'{v:g}' for v in wds)}"]


def next_launch(setting_dir: Path) -> Path:
    n = 0
    while (setting_dir / f"launch-{n}").exists():
        n += 1
    return setting_dir / f"launch-{n}"


def job_environment() -> dict[str, str]:
    """The jobs' environment: JAX's persistent compile cache on (the tests' folder, unless one is set), so a
    grid job reuses what an earlier job compiled alike (the held-out evaluation; the training step differs
    with the learning rate and weight decay, which optax holds as constants)."""
    env = dict(os.environ)
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(ROOT / ".cache" / "jax"))
    return env


def run_setting(setting: Setting, mixer: str, plan: Plan, out: Path, extra: list[str], run=subprocess.run) -> bool:
    """Train a setting's missing grid points; True when every point has a finished job.

    Rounds repeat while they make progress: a job that fails without a
    summary ends its multirun, and the next round retries the points after it.
    """
    setting_dir = out / setting.task / setting.label
    shared = job_overrides(setting, mixer, plan, extra)
    missing = missing_points(plan, finished_points(setting_dir))
    while missing:
        for lrs, wds in launches(missing):
            command = [sys.executable, str(ROOT / "train.py"), "-m", *shared, *grid_overrides(lrs, wds),
                       f"hydra.sweep.dir={next_launch(setting_dir)}"]
            print(f"[{time.strftime('%H:%M:%S')}] {setting.task} {setting.label}: {len(lrs) * len(wds)} jobs",
                  flush=True)
            print("  " + " ".join(command[1:]), flush=True)
            run(command, cwd=ROOT, env=job_environment())
        still = missing_points(plan, finished_points(setting_dir))
        if len(still) == len(missing):
            print(f"  {setting.task} {setting.label}: no job finished in this round; {len(still)} left", flush=True)
            return False
        missing = still
    return True


def title_and_notes(mixer: str | None, reduced: bool | None, seconds: float | None, command: str | None):
    name = "reduced " if reduced else ""
    title = f"MAD {name}scores" + (f": {mixer}" if mixer else "")
    notes = []
    if reduced:
        notes.append("Reduced protocol (tmem/sweeps/mad_settings.py): each task's baseline only, recall tasks at "
                     "seq_len 32 and selective copying at 64, batch 32, 160 steps, MAD's 3 x 2 lr x wd grid.")
    if command:
        notes.append(f"Command: `{command}`")
    if seconds is not None:
        notes.append(f"Wall time, every invocation of the command together: {seconds / 60:.1f} min.")
    return title, notes


TABLES = ["mad_scores.md", "mad_scores.csv", "mad_settings.csv", "jobs.csv"]


def score(out: Path, protocol: dict | None) -> int:
    """Gather and score everything under `out`; print and write the tables."""
    rows = mad_score.read_jobs(out)
    if not rows:
        print(f"error: no finished MAD jobs (<task>/<setting>/<launch>/<job>/summary.json) under {out}",
              file=sys.stderr)
        return 1
    reduced = (protocol or {}).get("reduced")
    enumerated = settings(reduced=bool(reduced)) if protocol else []
    order = [(s.task, s.label) for s in enumerated]
    expected = {t.label: sum(s.task == t.label for s in enumerated) for t in TASKS} if protocol else None
    title, notes = title_and_notes((protocol or {}).get("mixer"), reduced, (protocol or {}).get("seconds"),
                                   (protocol or {}).get("command"))
    _, text = mad_score.write_tables(out, title, rows, order, expected, notes)
    print(text)
    print(f"tables: {', '.join(str(out / t) for t in TABLES)}")
    return 0


def check_protocol(out: Path, protocol: dict) -> str | None:
    """An error line when `out` holds another protocol's jobs (another mixer, or full against reduced)."""
    if out.exists() and not out.is_dir():
        return f"error: --out {out} is a file; name a folder for the protocol's jobs and tables"
    path = out / "protocol.json"
    if path.is_file():
        old = json.loads(path.read_text())
        if (old.get("mixer"), old.get("reduced")) != (protocol["mixer"], protocol["reduced"]):
            return (f"error: {out} holds the {'reduced' if old.get('reduced') else 'full'} protocol of mixer "
                    f"{old.get('mixer')!r}: choose another --out")
    return None


def check_arguments(mixer: str, extra: list[str], chosen: list[Setting], plan: Plan) -> str | None:
    """One line for a mixer, task or override that would fail in train.py, found before any job is launched:
    every chosen setting's first job is composed and validated as train.py would."""
    from omegaconf import open_dict

    from tmem.command import check_group_overrides, compose_command
    from tmem.config import CONFIG_DIR, ConfigError, validate

    known = sorted(p.stem for p in (CONFIG_DIR / "mixer").glob("*.yaml"))
    if mixer not in known:
        return f"error: --mixer {mixer}: no such mixer; known: {', '.join(known)}"
    first = grid_overrides(plan.lrs[:1], plan.weight_decays[:1])
    try:
        for setting in chosen:
            args = [*job_overrides(setting, mixer, plan, extra), *first]
            problem = check_group_overrides(args)
            if problem:
                raise ConfigError(problem)
            composed = compose_command(args, sweeps=False)
            with open_dict(composed):
                del composed["hydra"]  # what train.py's function receives
            validate(composed)
    except ConfigError as e:
        return f"error: {e}"
    return None


def main(argv: list[str] | None = None, run=subprocess.run) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mixer", help="the mixer to score (configs/mixer/<name>.yaml)")
    parser.add_argument("--reduced", action="store_true", help="each task's baseline, short (a 2-core CPU)")
    parser.add_argument("--tasks", nargs="+", choices=[t.label for t in TASKS], help="only these tasks")
    parser.add_argument("--out", help="where jobs and tables go (default: multirun/mad[-reduced]/<mixer>)")
    parser.add_argument("--gather-only", metavar="DIR", help="launch nothing: score the finished jobs under DIR")
    parser.add_argument("--force", action="store_true", help="with --gather-only: overwrite the tables in a folder "
                                                             "the protocol did not make")
    args, extra = parser.parse_known_args(argv)
    unknown = [a for a in extra if a.startswith("-")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.gather_only:
        out = Path(args.gather_only)
        if not out.is_dir():
            return fail(f"error: no such directory: {out}")
        saved = out / "protocol.json"
        # the protocol's own folder: its tables describe its jobs and are rewritten as they grow; any other
        # folder's files are the user's
        problem = None if saved.is_file() else check_folder(out, TABLES, args.force)
        if problem:
            return fail(problem)
        return score(out, json.loads(saved.read_text()) if saved.is_file() else None)
    if not args.mixer:
        parser.error("--mixer is required (or --gather-only DIR)")
    default = f"multirun/mad{'-reduced' if args.reduced else ''}/{args.mixer}"
    out = Path(args.out or default).resolve()  # absolute: the jobs run from the repository root
    command = " ".join(["python -m tmem.sweeps.mad", *(argv if argv is not None else sys.argv[1:])])
    protocol = {"mixer": args.mixer, "reduced": args.reduced, "extra": extra, "command": command}
    plan = REDUCED if args.reduced else FULL
    chosen = [s for s in settings(reduced=args.reduced) if not args.tasks or s.task in args.tasks]
    problem = check_arguments(args.mixer, extra, chosen, plan) or check_protocol(out, protocol)
    if problem:
        return fail(problem)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "protocol.json"
    protocol["seconds"] = json.loads(path.read_text()).get("seconds", 0.0) if path.is_file() else 0.0
    path.write_text(json.dumps(protocol, indent=2) + "\n")  # claims `out` for this protocol before any job
    start, incomplete = time.perf_counter(), []
    for setting in chosen:
        if not run_setting(setting, args.mixer, plan, out, extra, run=run):
            incomplete.append(f"{setting.task} {setting.label}")
    protocol["seconds"] = round(protocol["seconds"] + time.perf_counter() - start, 1)  # over every invocation
    path.write_text(json.dumps(protocol, indent=2) + "\n")
    code = score(out, protocol)
    if incomplete:
        print(f"incomplete settings (run the command again to retry): {', '.join(incomplete)}", file=sys.stderr)
    return code or (1 if incomplete else 0)


if __name__ == "__main__":
    sys.exit(main())
