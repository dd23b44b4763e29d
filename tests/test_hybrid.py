"""Hybrid stacks (model.mixers): composing the entries, their recipe, positions, tied blocks, head masks, the
state size and FLOPs layer by layer, the probes, checkpoints and resume. Continuation is tests/test_continuation.py's
(each family inside a stack with softmax and Gated DeltaNet), data parallelism tests/test_mesh.py's."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import TINY, compose_config
from tmem.config import ConfigError, validate
from tmem.mixers.attention import SoftmaxConfig
from tmem.mixers.fast_weight import FastWeightConfig
from tmem.model import build_model
from tmem.train.loop import state_sizes

GDN_SOFTMAX = "model.mixers=[gated_deltanet,softmax]"
# TINY less its mixer.heads=2, which a hybrid without a softmax layer would refuse (it changes the mixer group)
TOKENS = [o for o in TINY if o != "mixer.heads=2"]


def config(*overrides):
    return validate(compose_config([*TOKENS, *overrides]))


def test_entries_are_their_rows_yaml_with_the_mixer_groups_changes_and_their_own_knobs_on_top():
    cfg = config("model.mixers=[gated_deltanet,{name:softmax,window:8},{name:linear,heads:4}]", "model.depth=4",
                 "mixer.window=4", "mixer.heads=2")  # the mixer group is softmax: its changes reach softmax entries
    gdn, softmax, linear, again = cfg.layers
    assert again == gdn and len(cfg.model.mixers) == 3  # the pattern cycled over the depth
    assert gdn == config("mixer=gated_deltanet").mixer  # its YAML, as mixer= reads it
    assert isinstance(softmax, SoftmaxConfig) and softmax.window == 8 and softmax.heads == 2  # the group's change
    assert isinstance(linear, FastWeightConfig) and linear.heads == 4 and linear.qk_norm == "l2"  # linear.yaml's
    assert config("model.mixers=[gated_deltanet,softmax]", "mixer.window=4").layers[1].window == 4
    named = config("model=gated_deltanet_hybrid")  # one attention layer in four
    assert [layer.name for layer in named.layers] == ["gated_deltanet"] * 3 + ["softmax"]


@pytest.mark.parametrize("overrides,message", [
    (("model.mixers=[gated_deltanet,mamba2]", "mixer.window=4"),
     "mixer.window=4 changes softmax, which model.mixers has no layer of: give it in an entry"),
    (("model.mixers=[gated_deltanet,mamba2]", "mixer.run.implementation=plain"),
     "mixer.run.implementation='plain' changes softmax, which model.mixers has no layer of"),
    ((GDN_SOFTMAX, "model.depth=1"), "model.mixers has 2 entries but model.depth=1"),
    (("model.mixers=[gated_deltanet,transformer]",), "model.mixers[1].name='transformer' is not one of: softmax"),
    (("model.mixers=[gated_deltanet,{name:softmax,heads:3}]",), "model.mixers[1].heads=3 must divide model.width"),
    (("model.mixers=[{name:gated_deltanet,window:3},softmax]",), "model.mixers[0].window: unknown field"),
    (("model.mixers=[gated_deltanet,mamba2]", "model.positions=rope"),
     "model.positions=rope: mixer 'gated_deltanet+mamba2' does not apply RoPE"),
])
def test_a_bad_hybrid_is_one_line_naming_its_entry(overrides, message):
    with pytest.raises(ConfigError, match="^" + message.replace("[", r"\[").replace("+", r"\+")):
        config(*overrides)


def test_the_recipe_is_the_entry_with_the_smallest_rate_and_optim_lr_still_wins():
    cfg = config("model.mixers=[gated_deltanet,{name:softmax,recipe:{lr:0.003,microbatch:16}}]")
    assert (cfg.mixer.name, cfg.optim.lr, cfg.train.microbatch) == ("softmax", 0.003, 16)
    cfg = config(GDN_SOFTMAX)  # equal rates: the first entry's, Gated DeltaNet's microbatch of 8
    assert (cfg.mixer.name, cfg.optim.lr, cfg.train.microbatch) == ("gated_deltanet", 0.01, 8)
    assert config(GDN_SOFTMAX, "optim.lr=0.001", "train.microbatch=null").optim.lr == 0.001


@pytest.mark.slow  # about 6 s: four models built; the one-entry hybrid test keeps hybrids in the quick subset
def test_auto_positions_go_to_the_layers_that_take_them():
    assert config(GDN_SOFTMAX).model.positions == "shortformer"
    assert config("model.mixers=[gated_deltanet,mamba2]").model.positions == "none"
    cfg = config(GDN_SOFTMAX)
    blocks = build_model(cfg, cfg.task).blocks
    assert [b.takes_qk_positions for b in blocks] == [False, True]
    cfg = config(GDN_SOFTMAX, "model.positions=rope")  # RoPE rotates the softmax layer's q and k alone
    model = build_model(cfg, cfg.task)
    assert model.blocks[1].mixer.rope and model(cfg.task.sample(jax.random.key(0), 2).inputs).shape[0] == 2


def test_a_plain_stack_is_unchanged_and_a_one_entry_hybrid_is_that_row():
    plain = config("mixer=gated_deltanet", "mixer.heads=2")  # the group's change, to its own row
    assert plain.model.mixers == () and plain.layers == (plain.mixer,) * 2
    one = config("model.mixers=[{name:gated_deltanet,heads:2}]")
    assert one.layers == plain.layers and dataclasses.replace(one.model, mixers=()) == plain.model
    tokens = plain.task.sample(jax.random.key(0), 2).inputs
    np.testing.assert_array_equal(build_model(one, one.task)(tokens), build_model(plain, plain.task)(tokens))


def test_tied_blocks_tie_the_pattern_and_loop_it():
    cfg = config(GDN_SOFTMAX, "model.depth=4", "model.tie_blocks=true")
    model = build_model(cfg, cfg.task)
    assert [type(b.mixer).__name__ for b in model.blocks] == ["FastWeight", "SoftmaxAttention"]
    _, states = model.forward(cfg.task.sample(jax.random.key(0), 2).inputs)
    assert [type(s).__name__ for s in states] == ["FastWeightState", "KVCache"] * 2


def test_head_masks_of_layers_with_different_head_counts_are_a_list():
    cfg = config("model.mixers=[{name:gated_deltanet,heads:1},{name:softmax,heads:4}]")
    model = build_model(cfg, cfg.task)
    assert model.head_counts == (1, 4)
    tokens = cfg.task.sample(jax.random.key(0), 2).inputs
    ones = [jnp.ones(n) for n in model.head_counts]
    np.testing.assert_allclose(model(tokens, head_mask=ones), model(tokens), rtol=1e-6, atol=1e-6)
    ablated = [ones[0], ones[1].at[2].set(0.0)]
    assert not np.allclose(model(tokens, head_mask=ablated), model(tokens))


def test_the_state_size_is_each_layers_own_summed():
    hybrid, gdn, softmax = (config(*o) for o in ((GDN_SOFTMAX,), ("mixer=gated_deltanet",), ()))
    total, per_token = state_sizes(hybrid)
    assert total == (state_sizes(gdn)[0] + state_sizes(softmax)[0]) // 2  # each plain stack has two such layers
    assert per_token == state_sizes(softmax)[1] // 2  # only the cache grows
    based = config("model=based")
    linear = based.layers[1]
    assert linear.widths(16)[1] == 1 + 16 + 16 * 16  # Taylor: 1 + d + d^2 features of d_k = 16
    d_v = 16 // linear.heads  # 2 heads: each a 273 x (8 + 1) memory (the normaliser's column), and the
    conv = 3 * (2 * linear.heads * 16 + 16)  # convolution's last 3 inputs of q and k (16 a head) and v
    assert (linear.heads, linear.state_size(16, 16)) == (2, 2 * 273 * (d_v + 1) + conv)


def test_the_memory_state_probe_reads_the_matrix_layers_and_names_the_others(model_and_tokens):
    from tmem.probes.memory_state import memory_state

    cfg, model, _ = model_and_tokens(GDN_SOFTMAX)
    report = memory_state(model, cfg.task.sample(jax.random.key(0), 4).inputs, cfg.task)
    assert report["layers"]["0"]["matrix_state"] and report["layers"]["0"]["mixer"] == "FastWeight"
    assert not report["layers"]["1"]["matrix_state"] and report["layers"]["1"]["reason"]


def test_probes_that_read_one_rows_weights_in_every_layer_name_the_others():
    from tmem.probes import PROBES

    hybrid = config(GDN_SOFTMAX)
    assert PROBES["induction"].applies(hybrid) == ("needs softmax attention in every layer (its patterns are what "
                                                   "it scores), not mixer 'gated_deltanet'")
    assert PROBES["induction"].applies(config()) is None


@pytest.mark.slow  # three short runs
def test_a_hybrid_resumes_bit_exact_and_restores_from_its_saved_entries(tiny_cfg, tmp_path):
    from tmem.train.checkpoint import Checkpoints
    from tmem.train.loop import run
    from tmem.train.restore import load_run
    from tmem.train.rundir import check_resume

    common = (GDN_SOFTMAX, "train.steps=16", "train.early_stop=false", "train.checkpoint_every=8")
    for name, extra in (("straight", ()), ("resumed", ("train.stop_after=8",))):
        cfg, resolved = tiny_cfg(*common, *extra)
        run(cfg, tmp_path / name, resolved)
    cfg, resolved = tiny_cfg(*common, "train.resume=true")
    assert run(cfg, tmp_path / "resumed", resolved)["resumed_from"] == 8
    saved = Checkpoints(tmp_path / "resumed" / "checkpoints").config()["model"]["mixers"]
    assert [entry["name"] for entry in saved] == ["gated_deltanet", "softmax"] and "chunk" in saved[0]["run"]  # in full
    _, changed = tiny_cfg(*common, "model.mixers=[gated_deltanet,{name:softmax,window:8}]", "train.resume=true")
    with pytest.raises(ConfigError, match=r"changes model\.mixers\.1\.window \(None -> 8\) from the run"):
        check_resume(tmp_path / "resumed", changed)  # a changed entry is named by its field, in one line
    a, b = load_run(tmp_path / "straight"), load_run(tmp_path / "resumed")
    assert a.cfg.layers == b.cfg.layers == cfg.layers and a.step == b.step == 16
    jax.tree.map(np.testing.assert_array_equal, *(jax.tree.leaves(r.model) for r in (a, b)))
