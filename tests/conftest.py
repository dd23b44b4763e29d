"""Shared test set-up: strict numerics, a persistent compile cache, tiny configs."""

from __future__ import annotations

import copy
import functools
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Set before jax starts, and inherited by the entry points tests run as subprocesses:
# compiled programs are cached across tests and processes, wandb never needs a network.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(ROOT / ".cache" / "jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")
# Without LLVM's optimisation passes a tiny test's programs compile in about half the time (a tiny training test
# from a cold cache: 32 s -> 16 s) and run no slower. A test that trains a real job runs its programs for minutes,
# and there the passes pay (DeltaNet's default job: 200 s without them, about 50 s with): such a test runs its
# entry point with `run_entry(..., optimised=True)`.
UNOPTIMISED = "--xla_backend_optimization_level=0"
OPTIMISED_FLAGS = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if f != UNOPTIMISED)
# (without the flag: xdist's workers inherit it from the process that started them)
os.environ["XLA_FLAGS"] = f"{OPTIMISED_FLAGS} {UNOPTIMISED}".strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")

# A model and task small enough to train in seconds.
TINY = [
    "task.vocab=32", "task.seq_len=16", "task.num_kv_pairs=2", "task.heldout_size=64",
    "model.width=16", "mixer.heads=2",
    "train.batch_size=16", "train.steps=20", "train.log_every=5", "train.eval_every=10",
    "train.checkpoint_every=10", "optim.warmup_steps=5", "logger=disabled",
]
# The same scale on the repeated-segment task (induction heads).
TINY_REPEAT = [
    "task=repeat", "task.vocab=16", "task.seq_len=24", "task.min_period=3", "task.max_period=10",
    "task.heldout_size=64", "model.width=16", "mixer.heads=2", "model.positions=shortformer", "model.norm=none",
    "train.batch_size=16", "train.steps=30", "train.log_every=5", "train.eval_every=10",
    "train.checkpoint_every=10", "train.keep_checkpoints=null", "train.early_stop=false", "logger=disabled",
]

# The one-layer in-context regression experiment, shrunk the same way (d = 4, N = 8).
TINY_LINREG = [
    "experiment=icl_gd", "task.dim=4", "task.num_examples=8", "task.heldout_size=256", "model.width=5",
    "train.batch_size=64", "train.steps=20", "train.log_every=5", "train.eval_every=10",
    "train.checkpoint_every=10", "logger=disabled",
]


# a task's sampler and loss, jitted once per task: a task (frozen, hashable) is a static argument
_sample = jax.jit(lambda task, key, n: task.sample(key, n), static_argnums=(0, 2))
_loss = jax.jit(lambda task, logits, batch: task.loss(logits, batch)[1], static_argnums=0)


def sample_task(task, n: int, seed: int = 0):
    """n examples of `task` from key `seed`, as numpy arrays."""
    return jax.tree.map(np.asarray, _sample(task, jax.random.key(seed), n))


def task_metrics(task, logits, batch) -> dict[str, float]:
    """The metrics `task.loss` reports for `logits` on `batch`."""
    return {k: float(v) for k, v in _loss(task, logits, batch).items()}


PARAM = type(pytest.param())  # what pytest.param returns


def quick_only(cases, quick, ids=str) -> list:
    """Parametrize `cases` so that only those whose id is in `quick` run in the quick subset (`-m "not slow"`);
    the rest are marked slow and run in the full suite. A case is a value or a `pytest.param` (whose id and
    marks are kept); `ids` names a plain value."""
    assert quick, "the quick subset keeps at least one case"
    out = []
    for c in cases:
        if not isinstance(c, PARAM):
            c = pytest.param(*(c if isinstance(c, tuple) else (c,)), id=ids(c))
        out.append(c if c.id in quick else pytest.param(*c.values, id=c.id, marks=[*c.marks, pytest.mark.slow]))
    unknown = set(quick) - {c.id for c in out}
    assert not unknown, f"quick cases that are not cases: {sorted(unknown)}"
    return out


def compose_config(overrides=(), config_name: str = "train", with_hydra: bool = False):
    """The composed config (Hydra's own under `hydra` if `with_hydra`), a copy of its own: a test may change it."""
    return copy.deepcopy(_composed(tuple(overrides), config_name, with_hydra))


@functools.cache
def _composed(overrides: tuple[str, ...], config_name: str, with_hydra: bool):
    # composed once a process: Hydra takes 0.1-0.2 s a composition (it reloads and merges every YAML file), a
    # copy 0.01, and the suite composes the same few lists hundreds of times
    import tmem.config  # noqa: F401  registers the base configs the YAML files extend

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose(config_name, overrides=list(overrides), return_hydra_config=with_hydra)


def entry_devices(*overrides) -> int:
    """How many CPU devices train.py trains this command's job on, here (cluster.cpu_devices)."""
    from tmem.config import validate
    from tmem.train.cluster import cpu_devices, usable_cores

    cfg = validate(compose_config(overrides))
    return cpu_devices(cfg.cluster, cfg.train, usable_cores(), os.environ) or 1


@pytest.fixture
def tiny_cfg():
    """Compose TINY (or another base list) plus overrides into a validated Config and its resolved dict."""
    from tmem.config import saved_form, validate

    def make(*overrides, base=TINY):
        cfg = compose_config([*base, *overrides])
        return validate(cfg), saved_form(cfg)

    return make


def fake_job(job: Path, overrides=(), config: dict | None = None, metrics: list[dict] = (), **summary) -> Path:
    """A finished job as train.py leaves it, with chosen numbers: summary.json (status completed, 10 steps, then
    `summary`), .hydra/config.yaml (`config`, else empty), .hydra/overrides.yaml and, given lines, metrics.jsonl."""
    import json

    (job / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(config or {}), job / ".hydra" / "config.yaml")
    OmegaConf.save(OmegaConf.create(list(overrides)), job / ".hydra" / "overrides.yaml")
    (job / "summary.json").write_text(json.dumps({"status": "completed", "steps": 10, **summary}))
    if metrics:
        (job / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in metrics))
    return job


TARGET = {"target_metric": "eval/accuracy", "target_value": 0.99, "higher_is_better": True}  # a summary's target


def softmax_and_linear(root):
    """Three seeds of two rows with known numbers, numbered as Hydra numbers `mixer=softmax,linear
    train.seed=0,1,2`; linear reaches the target in one seed of three."""
    for seed, (step, seconds, acc) in enumerate([(100, 1.0, 0.995), (300, 3.0, 0.99), (200, 2.0, 0.999)]):
        fake_job(root / str(seed), ["mixer=softmax", f"train.seed={seed}"], config={"train": {"steps": 500}},
                 metrics=[{"step": 50, "eval/accuracy": 0.5 + 0.1 * seed}, {"step": 100, "eval/accuracy": acc}],
                 **TARGET, target_step=step, target_seconds=seconds, steps=step, wall_seconds=seconds + 0.5,
                 parameters=1000, state_size=64, recipe={"lr": 0.003}, **{"eval/accuracy": acc})
    for seed, (step, wall, acc) in enumerate([(400, 4.0, 0.991), (None, 6.0, 0.6), (None, 7.0, 0.8)]):
        fake_job(root / str(3 + seed), ["mixer=linear", f"train.seed={seed}"], config={"train": {"steps": 500}},
                 metrics=[{"step": 50, "eval/accuracy": 0.2 * (seed + 1)}, {"step": 100, "eval/accuracy": acc},
                          {"step": 150, "eval/accuracy": acc}],
                 **TARGET, target_step=step, target_seconds=step and wall, steps=step or 500, wall_seconds=wall,
                 parameters=900, state_size=32, recipe={"lr": 0.01}, **{"eval/accuracy": acc},
                 status="completed" if step else "budget")


def run_entry(script: str, *args: str, timeout: float = 300, optimised: bool = False,
              **kwargs) -> subprocess.CompletedProcess:
    """Run train.py or eval.py as a user would, from the repository root (`optimised`: with LLVM's passes, for a
    real job that runs longer than it compiles)."""
    env = kwargs.pop("env", None)
    if optimised:
        env = {**(env or os.environ), "XLA_FLAGS": OPTIMISED_FLAGS}
    return subprocess.run([sys.executable, str(ROOT / script), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=env, **kwargs)


def check_run_record(run_dir: Path, stdout: str, overrides: list[str]) -> list[dict]:
    """Assert what a finished train.py run directory holds whatever the logger, and return its metrics.jsonl lines:
    the curve (training means every train.log_every, evaluations every train.eval_every and at the end, the
    schedule's rate, the wall time), the console log in train.log with the console's lines, bare there, and the
    resolved run in resolved.yaml and summary.json."""
    import json

    import yaml

    from tmem.config import validate
    from tmem.train.optim import learning_rate
    from tmem.train.record import read_metrics
    from tmem.train.resolved import RESOLVED, run_record

    cfg, summary = validate(compose_config(overrides)), json.loads((run_dir / "summary.json").read_text())
    t, steps = cfg.train, summary["steps"]
    lines = read_metrics(run_dir)
    evals = [line for line in lines if "eval/loss" in line]
    evals_at = sorted({*range(t.eval_every, steps + 1, t.eval_every), steps})  # and the last step, always
    assert [line["step"] for line in evals] == evals_at
    assert [line["step"] for line in lines if "train/loss" in line] == sorted(
        {*range(t.log_every, steps + 1, t.log_every), *evals_at})  # every evaluation logs the means before it
    assert evals[-1]["eval/accuracy"] == summary["eval/accuracy"]
    schedule = learning_rate(cfg.optim, cfg.decay_end)
    for line in lines:
        assert line["lr"] == pytest.approx(float(schedule(line["step"])), rel=1e-6)
    seconds = [line["wall_seconds"] for line in lines]
    assert seconds == sorted(seconds) and 0 < seconds[-1] <= summary["wall_seconds"]

    log = (run_dir / "train.log").read_text()
    for line in (f"config checked: task {cfg.task.name}, mixer {cfg.mixer.name}",
                 f"training on {summary['devices']} cpu device",
                 f"step {evals[0]['step']}: eval/accuracy={evals[0]['eval/accuracy']:.4f}",
                 f"{summary['status']} after {steps} steps", "checkpoint: "):
        assert line in log and line in stdout, line
    assert "[INFO]" in log and "[INFO]" not in stdout  # the file's prefixes, not the console's

    record = run_record(cfg, summary["hardware"], summary["versions"])
    assert {k: summary[k] for k in record} == record == yaml.safe_load((run_dir / RESOLVED).read_text())
    assert summary["hardware"] == {"devices": summary["devices"], "platform": "cpu", "kind": "cpu", "processes": 1}
    return lines


@pytest.fixture
def model_and_tokens(tiny_cfg):
    """make(*overrides) -> (config, a freshly built model, a batch of 3 random token sequences)."""
    def make(*overrides):
        from tmem.model import build_model

        cfg, _ = tiny_cfg(*overrides)
        tokens = jax.random.randint(jax.random.key(1), (3, cfg.task.seq_len), 0, cfg.task.vocab)
        return cfg, build_model(cfg, cfg.task), tokens
    return make


def untrained_run(run_dir: Path, composed, step: int = 0) -> Path:
    """A run directory whose one checkpoint, at `step`, holds the untrained state of the composed config (its
    resolved form saved beside it, as training saves it): all a probe or a notebook reads of a run, without
    compiling a training step."""
    from tmem.config import validate
    from tmem.train.build import build
    from tmem.train.checkpoint import Checkpoints

    state = build(validate(composed)).state
    Checkpoints(run_dir / "checkpoints", config=OmegaConf.to_container(composed, resolve=True)).save(
        state.replace(step=state.step + step))
    return run_dir


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """A finished tiny training run directory (train.py as a subprocess), shared by tests that read one."""
    run_dir = tmp_path_factory.mktemp("tiny_run")
    done = run_entry("train.py", *TINY, "train.steps=30", "train.keep_checkpoints=null",
                     "train.early_stop=false", f"hydra.run.dir={run_dir}")
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="session")
def tiny_repeat_run(tmp_path_factory) -> Path:
    """A finished tiny run on the repeat task with every checkpoint kept (for induction probes)."""
    from tmem.config import validate
    from tmem.train.loop import run

    run_dir = tmp_path_factory.mktemp("tiny_repeat_run")
    cfg = compose_config(TINY_REPEAT)
    run(validate(cfg), run_dir, OmegaConf.to_container(cfg, resolve=True))
    return run_dir


def wandb_run(run_dir: Path) -> dict:
    """The run record of the one offline wandb run under `run_dir`: its group, name and config.

    Read from the run's .wandb file (a leveldb-style log of protobuf records,
    the first `run` record holding what wandb.init was given), so a test sees
    what `wandb sync` would upload.
    """
    import json

    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = Path(run_dir).glob("wandb/offline-run-*/run-*.wandb")
    data, pos, block, pieces = path.read_bytes(), 7, 32768, b""  # 7: the file's own header
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a record header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        pieces += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(pieces)
            pieces = b""
            if record.WhichOneof("record_type") == "run":
                return {"group": record.run.run_group, "name": record.run.display_name,
                        "config": {i.key: json.loads(i.value_json) for i in record.run.config.update}}
    raise AssertionError(f"{path} holds no run record")
