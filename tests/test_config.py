"""Config groups compose, validate, and fail in one line naming the field."""

from pathlib import Path

import pytest

from conftest import ROOT, compose_config, quick_only, run_entry
from tmem.command import check_group_overrides
from tmem.config import GROUPS, ConfigError, validate

OPTIONS = [(group, p.stem) for group in GROUPS if group != "experiment"
           for p in sorted((ROOT / "configs" / group).glob("*.yaml"))]
EXPERIMENTS = sorted(p.stem for p in (ROOT / "configs" / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("group, option", OPTIONS)
def test_every_group_option_composes_and_validates(group, option):
    cfg = validate(compose_config([f"{group}={option}"]))
    assert getattr(cfg, group) is not None


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_validates(experiment):
    validate(compose_config([f"experiment={experiment}"]))


def test_an_experiment_can_set_train_fields():
    cfg = validate(compose_config(["experiment=induction_heads"]))
    assert cfg.train.steps == 2000 and cfg.train.keep_checkpoints is None and cfg.train.target is None
    assert validate(compose_config(["experiment=induction_heads", "train.steps=7"])).train.steps == 7


def test_shortformer_needs_a_mixer_with_query_and_key_inputs(monkeypatch):
    from tmem.mixers.attention import SoftmaxConfig

    validate(compose_config(["model.positions=shortformer"]))
    monkeypatch.setattr(SoftmaxConfig, "takes_qk_positions", False)
    with pytest.raises(ConfigError, match="model.positions=shortformer: mixer 'softmax' has no query and key"):
        validate(compose_config(["model.positions=shortformer"]))


def test_eval_config_composes():
    cfg = compose_config(["run=/tmp/x", "probes=[mqar_distance]"], config_name="eval")
    assert list(cfg.probes) == ["mqar_distance"]


@pytest.mark.parametrize("overrides, message", [
    (["+model.widht=32"], "model.widht: unknown field; allowed: width, depth"),
    (["model.width=abc"], "model.width"),
    (["model.width=30", "mixer.heads=4"], "mixer.heads=4 must divide model.width=30"),
    (["model.positions=sinusoid"], "model.positions='sinusoid' is not one of: auto, rope, learned, none"),
    (["optim.schedule=step"], "optim.schedule='step' is not one of"),
    (["train.steps=0"], "train.steps=0 must be positive"),
    (["task.num_kv_pairs=40"], "task.num_kv_pairs too large"),
    (["+task.keys=3"], "task.keys: unknown field"),
    (["mixer.name=mamba3"], "mixer.name='mamba3' is not one of: softmax, hopfield, lsa, linear"),
    # values that trained, compiled or reported completion before they were refused
    (["task.num_kv_pairs=0"], "task.num_kv_pairs must be at least 1"),
    (["task.num_passes=0"], "task.num_passes must be at least 1"),
    (["task.heldout_size=0"], "task.heldout_size must be at least 1"),
    (["task=repeat", "task.heldout_size=0"], "task.heldout_size must be at least 1"),
    (["task=triggers", "task.heldout_size=0"], "task.heldout_size must be at least 1"),
    (["task=linreg", "mixer=lsa", "task.heldout_size=0"], "task.heldout_size must be at least 1"),
    (["optim.warmup_steps=-10"], "optim.warmup_steps=-10 must be zero or more"),
    (["optim.b1=1.5"], "optim.b1=1.5 must be in [0, 1)"),
    (["optim.b2=1.0"], "optim.b2=1.0 must be in [0, 1)"),
    (["optim.weight_decay=-0.1"], "optim.weight_decay=-0.1 must be zero or more"),
    (["optim.eps=0"], "optim.eps=0.0 must be positive"),
    (["optim.decay_steps=100"], "optim.decay_steps=100 must be more than optim.warmup_steps=100"),
    (["train.microbatch=half"], "train.microbatch='half' must be a positive integer, null or auto"),
    (["train.microbatch=24"], "train.microbatch=24 must divide train.batch_size=64"),
    (["mixer.recipe.microbatch=24"], "train.microbatch=24 must divide train.batch_size=64 (train.microbatch=auto takes "
                              "mixer.recipe.microbatch; set train.microbatch)"),
])
def test_bad_configs_fail_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as e:
        validate(compose_config(overrides))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_unknown_group_option_names_the_allowed_ones():
    problem = check_group_overrides(["mixer=softmax,linear_attention"])
    mixers = ", ".join(sorted(p.stem for p in (ROOT / "configs" / "mixer").glob("*.yaml")))
    assert problem == f"mixer=linear_attention: no such option; allowed: {mixers}"
    assert check_group_overrides(["mixer=softmax", "model.width=8", "experiment=null"]) is None


@pytest.mark.parametrize("args, message", quick_only([  # a process each: the quick subset keeps one
    pytest.param(["mlp=nope"], "config error: mlp=nope: no such option; allowed:", id="unknown-option"),
    pytest.param(["model.width=30"], "config error: mixer.heads=4 must divide model.width=30", id="bad-value"),
    pytest.param(["hydra.run.dir={file}"], "config error: hydra.run.dir={file} is a file, not a directory",
                 id="run-dir-is-a-file"),
], {"bad-value"}))
def test_entry_point_prints_one_line_and_no_traceback(args, message, tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("kept")
    args, message = [a.format(file=a_file) for a in args], message.format(file=a_file)
    done = run_entry("train.py", f"hydra.run.dir={tmp_path}", *args, "logger=disabled", timeout=120)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].startswith(message)
    assert a_file.read_text() == "kept"
    assert "Traceback" not in done.stderr
    assert not (Path(tmp_path) / "checkpoints").exists()


def test_learning_rate_defaults_to_the_mixers_and_a_set_one_wins():
    assert validate(compose_config([])).optim.lr == validate(compose_config([])).mixer.recipe.lr
    assert validate(compose_config(["optim.lr=3e-4"])).optim.lr == 3e-4


def test_a_rows_recommended_schedule_fills_what_optim_leaves_null():
    """Mamba-2 recommends its decay's end and a weight decay (mixer.recipe); a set optim.* wins, a row that
    recommends none gets the optim group's defaults, and an experiment that pins them trains every row alike."""
    optim = lambda *overrides: validate(compose_config(["logger=disabled", *overrides])).optim  # noqa: E731
    assert (optim("mixer=mamba2").decay_steps, optim("mixer=mamba2").weight_decay) == (1500, 0.3)
    assert (optim("mixer=linear").decay_steps, optim("mixer=linear").weight_decay) == (None, 0.0)
    set_ = optim("mixer=mamba2", "optim.decay_steps=3000", "optim.weight_decay=0")
    assert (set_.decay_steps, set_.weight_decay) == (3000, 0.0)
    assert optim("mixer=mamba2", "mixer.recipe.weight_decay=0.1").weight_decay == 0.1
    pinned = optim("experiment=capacity_gap", "mixer=mamba2")
    assert (pinned.decay_steps, pinned.weight_decay) == (2000, 0.0)
    with pytest.raises(ConfigError, match="optim.decay_steps=1500 must be more than optim.warmup_steps=2000: .*; "
                                          "mixer=mamba2 recommends mixer.recipe.decay_steps=1500, "):
        optim("mixer=mamba2", "optim.warmup_steps=2000")


def test_the_microbatch_defaults_to_the_mixers_and_a_set_one_wins():
    """A slice size changes only the speed, so each row may keep its own; auto takes it, a number or null wins."""
    train = lambda *overrides: validate(compose_config(list(overrides))).train  # noqa: E731
    assert train().microbatch == validate(compose_config([])).mixer.recipe.microbatch
    assert train("mixer.recipe.microbatch=16").microbatch == 16
    assert train("mixer.recipe.microbatch=16", "train.microbatch=8").microbatch == 8
    assert train("mixer.recipe.microbatch=16", "train.microbatch=null").microbatch is None


def test_the_step_cap_is_the_rows_where_the_command_leaves_it():
    """Mamba-1's seeds need about 6,000 steps of the default job, so its recipe lengthens the job; a set
    train.steps or an experiment's wins, and the experiments' decay over ${train.steps} follows the cap."""
    train = lambda *overrides: validate(compose_config(["logger=disabled", *overrides])).train  # noqa: E731
    assert (train().steps, train("mixer=mamba").steps) == (5000, 8000)
    assert train("mixer=mamba", "train.steps=300").steps == 300
    assert train("mixer=linear", "mixer.recipe.steps=700").steps == 700
    pinned = validate(compose_config(["experiment=capacity_gap", "mixer.recipe.steps=700"]))
    assert (pinned.train.steps, pinned.optim.decay_steps) == (2000, 2000)
    with pytest.raises(ConfigError, match=r"^mixer.recipe.steps=0 must be a positive number of steps, or null"):
        train("mixer=mamba", "mixer.recipe.steps=0")
    with pytest.raises(ConfigError, match=r"^train.log_every: Interpolation key 'nowhere' not found"):
        train("train.log_every=${nowhere}")  # any other failed interpolation names its field once


@pytest.mark.parametrize("task, target", [("mqar", 0.99), ("memorize", 1.0), ("linreg", None)])
def test_the_target_is_the_tasks_own_unless_set(task, target):
    assert validate(compose_config([f"task={task}"])).train.target == target
    assert validate(compose_config([f"task={task}", "train.target=0.5"])).train.target == 0.5
