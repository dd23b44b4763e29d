"""Eval-time task overrides (length generalisation): they reach every probe, the model stays as trained,
and a request the trained model cannot read is one line before anything is restored or written."""

from __future__ import annotations

import functools
import importlib
import json
from pathlib import Path

import pytest
from flax import nnx
from omegaconf import OmegaConf

from conftest import TINY, TINY_LINREG, compose_config, run_entry
from tasks import heldout
from tmem.config import ConfigError
from tmem.probes import PROBES, Probe
from tmem.schema import LoggerConfig
from tmem.train.checkpoint import FINISHED
from tmem.train.evaluate import evaluate
from tmem.train.task_overrides import with_task

QUIET = LoggerConfig(mode="disabled")
ROPE = ["model.positions=rope", "task.vocab=64"]  # MQAR needs vocab > seq_len: 64 leaves room for 32 tokens


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory) -> Path:
    """A TINY MQAR run with RoPE (no position table) at seq_len 16: its untrained state saved as the run's
    checkpoint, all the eval frame reads, without compiling a training step."""
    from tmem.config import validate
    from tmem.train.build import build
    from tmem.train.checkpoint import Checkpoints

    run_dir = tmp_path_factory.mktemp("rope_run")
    cfg = compose_config([*TINY, *ROPE])
    Checkpoints(run_dir / "checkpoints", config=OmegaConf.to_container(cfg, resolve=True)).save(
        build(validate(cfg)).state)
    return run_dir


@functools.lru_cache
def resolved(*overrides: str) -> dict:
    """TINY's resolved config with overrides, composed once per module (composing is most of a refusal's cost)."""
    return OmegaConf.to_container(compose_config([*TINY, *overrides]), resolve=True)


@pytest.fixture
def record(tmp_path):
    """record(*overrides): a run directory as eval.py's checks read it (its config in a finished checkpoint
    step, no arrays), made in milliseconds: refusals come before anything is restored."""
    def make(*overrides):
        step = tmp_path / "run" / "checkpoints" / "20"
        step.mkdir(parents=True)
        (step / FINISHED).write_text(json.dumps({"custom_metadata": {"config": resolved(*overrides)}}))
        return tmp_path / "run"
    return make


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_overrides_reach_every_probe_and_the_model_stays_as_trained(rope_run, tmp_path, monkeypatch):
    seen = {}

    def spy(inp):
        seen.update(cfg=inp.cfg, model=inp.model)
        return {}, {}

    monkeypatch.setitem(PROBES, "spy", Probe(run=spy))
    report = evaluate(str(rope_run), ["heldout", "spy"], out_dir=tmp_path, logger=QUIET,
                      task={"seq_len": 32, "num_kv_pairs": 4})
    assert report["task_overrides"] == {"seq_len": 32, "num_kv_pairs": 4}
    assert report["task"]["name"] == "mqar" and report["task"]["seq_len"] == 32 and report["task"]["num_kv_pairs"] == 4
    assert report["heldout"]["seq_len"] == 32 and 0 <= report["heldout"]["accuracy"] <= 1
    # the softmax row's length scaling keeps the trained length: in the config the probes get and in the model
    assert seen["cfg"].task.seq_len == 32 and seen["cfg"].mixer.train_length == 16
    assert all(block.mixer.cfg.train_length == 16 for block in seen["model"].blocks)


def test_a_report_describes_one_task(rope_run, tmp_path):
    """The same folder read without overrides starts a new report; heldout then gives training's number."""
    earlier = {"step": 0, "task_overrides": {"seq_len": 32}, "mqar_distance": {"overall_accuracy": 0.5}}
    (tmp_path / "report.json").write_text(json.dumps(earlier))  # the same step, read on another task
    report = evaluate(str(rope_run), ["heldout"], out_dir=tmp_path, logger=QUIET)
    assert report["task_overrides"] == {} and report["task"]["seq_len"] == 16 and "mqar_distance" not in report
    assert json.loads((tmp_path / "report.json").read_text())["heldout"]["seq_len"] == 16
    from tmem.train.restore import load_run
    from tmem.train.step import make_eval

    run = load_run(rope_run)
    graphdef, params, rest = nnx.split(run.model, nnx.Param, ...)
    trained = make_eval(graphdef, run.cfg.task)(params, rest, heldout(run.cfg.task))  # the training loop's eval
    assert report["heldout"]["accuracy"] == pytest.approx(float(trained["accuracy"]), abs=1e-6)
    assert report["heldout"]["loss"] == pytest.approx(float(trained["loss"]), rel=1e-5)


def test_evaluations_keep_compiled_programs_where_training_does():
    from tmem.command import compose_command
    from tmem.schema import ClusterConfig

    assert compose_command(["run=/r"], "eval").compilation_cache == ClusterConfig().compilation_cache
    assert compose_command(["run=/r", "compilation_cache=null"], "eval").compilation_cache is None


def test_reports_go_to_a_folder_named_by_the_overrides():
    eval_module = importlib.import_module("eval")
    from tmem.command import compose_command

    out = compose_command(["run=/r", "task.seq_len=256", "task.num_kv_pairs=32"], "eval").hydra.run.dir
    assert out == "/r/eval/task.num_kv_pairs=32,task.seq_len=256"  # sorted: any order, one folder
    assert compose_command(["run=/r"], "eval").hydra.run.dir == "/r/eval"
    assert eval_module.eval_dir("/r", OmegaConf.create({"power_a": 0.5, "random_non_queries": False})) == \
        "/r/eval/task.power_a=0.5,task.random_non_queries=false"


# Each request must stop in one line naming the problem and its fix, with the run directory as it was.
BAD = [
    (["model.positions=shortformer"], ["task.seq_len=24"],
     "task.seq_len=24: sequences of 24 tokens run past the run's learned position table "
     "(model.positions=shortformer, 16 rows): evaluate at most 16 tokens, or train with model.positions=rope or none"),
    (["model.positions=learned"], ["task.seq_len=64"],  # the table is named before the vocabulary (32 < 64)
     "model.positions=learned, 16 rows"),
    (ROPE, ["task.foo=1"], "task.foo: task 'mqar' has no such field; allowed: train_examples, vocab, seq_len"),
    (ROPE, ["task.name=repeat"], "task.name=repeat: an evaluation reads the run's own task ('mqar')"),
    (ROPE, ["task.vocab=128"], "task.vocab=128 gives a vocabulary of 128 tokens, more than the run's embedding "
                               "holds (64): evaluate within the trained vocabulary"),
    (ROPE, ["task.seq_len=31"], "task.seq_len=31: task.seq_len must be even"),
    (ROPE, ["task.seq_len=long"], "task.seq_len=long: task.seq_len: Value 'long' of type 'str' could not be "
                                  "converted to Integer"),
]


@pytest.mark.parametrize("trained, args, message", BAD, ids=[" ".join(a) for _, a, _ in BAD])
def test_a_task_the_model_cannot_read_is_refused_in_one_line_writing_nothing(trained, args, message, record):
    run = record(*trained)
    before = snapshot(run.parent)
    with pytest.raises(ConfigError) as raised:
        importlib.import_module("eval").check_command([f"run={run}", "probes=[heldout]", *args])
    assert message in str(raised.value) and "\n" not in str(raised.value)
    assert snapshot(run.parent) == before


def test_overrides_need_a_run():
    with pytest.raises(ConfigError, match=r"^task.seq_len=32: task overrides change a trained run's task: "
                                          r"pass run=<run dir>$"):
        importlib.import_module("eval").check_command(["probes=[capacity]", "task.seq_len=32"])


def test_the_trained_fit_is_kept_and_a_vector_task_keeps_its_token_size(tiny_cfg):
    cfg, _ = tiny_cfg("model.positions=rope", "mixer.length_scale=logn")
    longer = with_task(cfg, {"seq_len": 24, "num_kv_pairs": 6})
    assert longer.task.seq_len == 24 and longer.mixer == cfg.mixer and longer.mixer.train_length == 16
    assert with_task(cfg, {}) is cfg
    shorter, _ = tiny_cfg()  # shortformer: a shorter sequence reads the table's first rows
    assert with_task(shorter, {"seq_len": 8}).task.seq_len == 8
    vectors, _ = tiny_cfg(base=TINY_LINREG)
    assert with_task(vectors, {"num_examples": 16}).task.seq_len == 17
    with pytest.raises(ConfigError, match="task.dim=5 gives tokens of 6 coordinates, but the run's model reads 5"):
        with_task(vectors, {"dim": 5})


@pytest.mark.slow
def test_eval_py_writes_the_overridden_report_beside_the_others(rope_run):
    done = run_entry("eval.py", f"run={rope_run}", "probes=[heldout]", "task.seq_len=32", "logger=disabled")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((rope_run / "eval" / "task.seq_len=32" / "report.json").read_text())
    assert report["task"]["seq_len"] == 32 and report["task_overrides"] == {"seq_len": 32}
    assert not (rope_run / "eval" / "report.json").exists()  # the trained task's report has a folder of its own
