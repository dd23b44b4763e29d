"""Continuing from a state equals reading the whole sequence, for every mixer config (a new row joins by its file).

A sequence is read in three segments whose split points are not multiples of
the chunk, each continuing from the states the previous one handed on; the
outputs must equal one call over the whole sequence. The states' token counts
are checked as counters: learned positions and RoPE start where they say.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from omegaconf import OmegaConf

from conftest import ROOT, TINY, quick_only
from golden import MIXERS, MLP_SWITCHES, VECTOR, VECTOR_ROWS, _with_heads
from tmem.mixers import CONFIGS



def splits(T: int) -> tuple[int, int]:
    """Three segments, none a multiple of the chunk 4: 5, 8, 3 tokens of T = 16; 5, 1, 3 of the prompt's 9."""
    return 5, T - 3


def _chunked(mixer: str) -> list[str]:
    """A chunk of 4 where the row's file sets one, and a mini-batch of 4 where the row has mini-batches, so every
    split falls inside one."""
    node = OmegaConf.load(ROOT / "configs" / "mixer" / f"{mixer}.yaml")  # a row's file, or a setting of one
    chunk = ["mixer.run.chunk=4"] if "chunk" in node.get("run", {}) else []
    return chunk + (["mixer.mini_batch=4"] if "mini_batch" in {f.name for f in dataclasses.fields(CONFIGS[node.name])}
                    else [])


def _entry(mixer: str) -> str:
    """A hybrid's entry for `mixer` with the knobs `_chunked` and `_with_heads` give a plain stack, in Hydra's
    inline form: {name:mesa,heads:2,chunk:4}."""
    knobs = [o.removeprefix("mixer.").replace("=", ":") for o in _chunked(mixer)]
    heads = [] if mixer == "none" else ["heads:2"]
    return "{" + ",".join([f"name:{mixer}", *heads, *knobs]) + "}"


# a row of each kind of state inside a hybrid stack with softmax (a cache) and Gated DeltaNet (a matrix), every
# layer continuing from its own: mesa's two sums, a gradient memory's weights, and none; each row's own state is
# held to one call by its `tokens-` case, so the stack's cases test only how a stack hands states to its layers
HYBRID_ROWS = ("mesa", "ttt_linear", "none")


# rows also read as a looped model (tied blocks, learned positions), one per kind of state: a looped model keeps
# one state per application and learned positions need the token count, which is the backbone's part
TIED_ROWS = {"softmax", "none", "retnet", "mesa", "ttt_linear"}


def cases() -> dict[str, list[str]]:
    tokens = [o for o in TINY if o != "mixer.heads=2"]
    one = [*tokens, "model.depth=1"]  # one layer where a case tests a row's own state: the stacks hand on several
    out = {}
    for m in MIXERS:
        out[f"tokens-{m}"] = [*_with_heads(one, m), *_chunked(m)]
        if m in TIED_ROWS:
            out[f"tokens-{m}-tied-learned"] = [*_with_heads(tokens, m), *_chunked(m), "model.depth=3",
                                               "model.tie_blocks=true", "model.positions=learned"]
        if m in VECTOR_ROWS | {"lsa"}:
            causal = ["mixer.layout=causal", "task.format=garg", "task.score=every"] if m == "lsa" else []
            out[f"vectors-{m}"] = [*_with_heads(VECTOR, m), *_chunked(m), *causal]
    out["tokens-softmax-rope"] = [*_with_heads(one, "softmax"), "model.positions=rope"]
    # the MLPs read each position alone, so they continue whatever the split; a mixture's routing and a memory's
    # search are the same for a token in any call
    out.update({f"tokens-softmax-{name}": [*_with_heads(one, "softmax"), *mlp] for name, mlp in MLP_SWITCHES.items()
                if name in ("moe", "pkm")})
    for m in HYBRID_ROWS:
        layers = ",".join(_entry(row) for row in (m, "softmax", "gated_deltanet"))
        out[f"hybrid-{m}"] = [*tokens, f"model.mixers=[{layers}]", "model.depth=3"]
    # a tied hybrid: one block per entry, the pattern looped, each application its own state
    out["hybrid-tied-learned"] = [*tokens, f"model.mixers=[{_entry('gated_deltanet')},{_entry('softmax')}]",
                                  "model.depth=3", "model.tie_blocks=true", "model.positions=learned"]
    out["hybrid-based"] = [*tokens, "model=based"]
    out["tokens-mesa-chunked"] = [*_with_heads(one, "mesa"), "mixer.run.form=chunked", "mixer.run.chunk=4"]
    return out


@partial(jax.jit, static_argnums=2)
def _read(model, inputs, splits):
    """The whole sequence in one call, and in three calls that continue from each other's states."""
    full, _ = model.forward(inputs)
    outs, states, lengths = [], None, []
    for a, b in zip((0, *splits), (*splits, inputs.shape[1])):
        out, states = model.forward(inputs[:, a:b], states=states)
        outs.append(out)
        lengths.append([s.length for s in states])
    return full, jnp.concatenate(outs, 1), lengths


# the quick subset: a cache with RoPE, a store in the vector model, and a hybrid; the rest are slow (a fast-weight state,
# whose model compiles for 6 s, continues quick in tests/test_chunked.py)
QUICK = {"tokens-softmax-rope", "vectors-lsa", "hybrid-none"}


@pytest.mark.parametrize("case", quick_only(sorted(cases()), QUICK))
def test_continuing_from_states_equals_one_call(tiny_cfg, case):
    from tmem.model import build_model

    cfg, _ = tiny_cfg(*cases()[case], base=[])
    model = build_model(cfg, cfg.task)
    inputs = cfg.task.sample(jax.random.key(3), 3).inputs
    T = inputs.shape[1]
    full, continued, lengths = _read(model, inputs, splits(T))
    np.testing.assert_allclose(continued, full, rtol=1e-5, atol=1e-5)
    assert [[int(n) for n in step] for step in lengths] == [[n] * cfg.model.depth for n in (*splits(T), T)]
