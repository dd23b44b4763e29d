"""A row from outside tmem (tests/my_memory, which tmem never imports by name) gets what a built-in row gets.

Its YAML sits in its own config directory, added to Hydra's search path on the
command line, and names its Row by import path (mixer._row_); pytest puts
tests/ on sys.path, and the entry points get it on PYTHONPATH, as a
researcher's package would be installed. docs/add-a-memory.md walks through it.
"""

from __future__ import annotations

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from omegaconf import OmegaConf

from conftest import ROOT, TINY, compose_config, run_entry
from my_memory import DecayedConfig, decayed_read
from test_continuation import _read, splits
from tmem.config import ConfigError, validate
from tmem.memory.linear_state import recurrent

SEARCH = f"hydra.searchpath=[file://{ROOT}/tests/my_memory/configs]"
OUTSIDE = [*TINY, "mixer=decayed", SEARCH]


def test_the_fast_form_equals_its_definition():
    """The parallel read against tmem's token scan of the same write (a fixed decay, the add rule), from a state,
    everywhere and at chosen positions."""
    B, T, H, d, a = 2, 7, 2, 4, 0.8
    q, k, v = (jax.random.normal(jax.random.key(i), (B, T, H, d)) for i in range(3))
    S0 = jax.random.normal(jax.random.key(3), (B, H, d, d))
    with jax.default_matmul_precision("highest"):
        y, S = decayed_read(q, k, v, jnp.arange(T), a, S0)
        read_at = jnp.array([[1, 6], [0, 4]])
        y_at, _ = decayed_read(jnp.take_along_axis(q, read_at[:, :, None, None], 1), k, v, read_at, a, S0)
    want_y, want_S = recurrent(q, k, v, log_a=jnp.full((1, T, H, 1), math.log(a)), state=S0,
                               precision=jax.lax.Precision.HIGHEST)
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(S, want_S, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y_at, jnp.take_along_axis(want_y, read_at[:, :, None, None], 1), rtol=1e-5, atol=1e-5)


def test_an_outside_row_validates_continues_is_probed_and_counted_as_uncounted():
    from tmem.command import check_group_overrides
    from tmem.flops import step_flops
    from tmem.mixers.flops import Uncounted
    from tmem.model import build_model
    from tmem.probes.memory_state import matrix_memory, written

    assert check_group_overrides(OUTSIDE) is None
    cfg = validate(compose_config(OUTSIDE))
    assert type(cfg.mixer) is DecayedConfig and cfg.mixer.heads == 2
    with pytest.raises(ConfigError, match=r"mixer.decay=1.5 must be in \(0, 1\]"):
        validate(compose_config([*OUTSIDE, "mixer.decay=1.5"]))
    model = build_model(cfg, cfg.task)
    inputs = cfg.task.sample(jax.random.key(3), 3).inputs
    full, continued, lengths = _read(model, inputs, splits(inputs.shape[1]))
    np.testing.assert_allclose(continued, full, rtol=1e-5, atol=1e-5)
    assert [[int(n) for n in step] for step in lengths] == [[n] * cfg.model.depth for n in (5, 13, 16)]
    states, keys = written(model, inputs)
    matrix, why = matrix_memory(model.blocks[0].mixer, states[0])
    assert why is None and matrix.shape == (3, 2, 8, 8) and keys[0].shape == (3, 16, 2, 8)
    with pytest.raises(Uncounted, match="mixer 'decayed' has no FLOP count: give DecayedConfig a `flops` method"):
        step_flops(cfg)


@pytest.mark.slow  # compiles a two-layer model three times (the quick subset has the outside row alone)
def test_an_outside_row_stacks_with_softmax_in_a_hybrid():
    """A hybrid entry names the outside row by `_row_` (its config's defaults, then the entry's knobs, its run part
    too): the stack validates, each layer continues from its own state, and the saved entries name the row, so
    the run's saved config validates as the same model."""
    from tmem.config import saved_form
    from tmem.model import build_model

    hybrid = [*TINY, "model.mixers=[{_row_:my_memory.ROW,decay:0.8,run:{form:recurrent}},softmax]"]
    cfg = validate(compose_config(hybrid))
    outside, softmax = cfg.model.mixers
    assert type(outside) is DecayedConfig and (outside.decay, outside.run.form) == (0.8, "recurrent")
    assert softmax.name == "softmax" and softmax.heads == 2  # TINY's mixer.heads reaches the softmax layers
    model = build_model(cfg, cfg.task)
    inputs = cfg.task.sample(jax.random.key(3), 3).inputs
    full, continued, lengths = _read(model, inputs, splits(inputs.shape[1]))
    np.testing.assert_allclose(continued, full, rtol=1e-5, atol=1e-5)
    assert [[int(n) for n in step] for step in lengths] == [[n] * cfg.model.depth for n in (5, 13, 16)]
    saved = saved_form(compose_config(hybrid))
    assert saved["model"]["mixers"][0]["_row_"] == "my_memory.ROW"
    assert validate(OmegaConf.create(saved)) == cfg


@pytest.mark.parametrize("path, message", [
    ("my_memory.NOPE", "mixer._row_=my_memory.NOPE: cannot import it (AttributeError"),
    ("no_such_package.ROW", "mixer._row_=no_such_package.ROW: cannot import it (ModuleNotFoundError"),
    ("my_memory.DecayedConfig", "mixer._row_=my_memory.DecayedConfig is a ABCMeta, not a tmem.mixers.Row"),
])
def test_a_row_path_that_names_no_row_is_one_line(path, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        validate(compose_config([*OUTSIDE, f"mixer._row_={path}"]))


@pytest.mark.slow
def test_an_outside_row_trains_restores_and_resumes_only_as_itself(tmp_path):
    from tmem.train import rundir
    from tmem.train.restore import load_run

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    done = run_entry("train.py", *OUTSIDE, f"hydra.run.dir={tmp_path}", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 20
    run = load_run(tmp_path)  # imports the row its saved config names
    assert type(run.cfg.mixer) is DecayedConfig and run.step == 20
    logits, _ = run.model.forward(run.cfg.task.sample(jax.random.key(0), 2).inputs)
    assert np.isfinite(np.asarray(logits)).all()
    saved = OmegaConf.to_container(OmegaConf.load(tmp_path / ".hydra" / "config.yaml"), resolve=True)
    assert saved["mixer"]["_row_"] == "my_memory.ROW"
    rundir.check_resume(tmp_path, saved)  # the same run resumes
    with pytest.raises(ConfigError, match=r"changes mixer.decay \(0.9 -> 0.5\)"):
        rundir.check_resume(tmp_path, {**saved, "mixer": {**saved["mixer"], "decay": 0.5}})
