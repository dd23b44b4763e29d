"""The regression grid (tmem/mixers/regression.py): its named cells are the rows, every other cell trains, and a
cell that cannot work is refused in one line before anything compiles."""

import dataclasses
from functools import lru_cache

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from conftest import compose_config, quick_only
from tmem.config import ConfigError, validate
from tmem.mixers import layer_of, row_configs
from tmem.train.build import build

WIDTH, T = 16, 8

# each named row as the issue spells its cell: weights, function, optimizer (and the iterative rules' decay)
NAMED = {
    "linear": ["mixer.weights=uniform", "mixer.function=linear", "mixer.optimizer=one_step"],
    "retnet": ["mixer.weights=decay", "mixer.function=linear", "mixer.optimizer=one_step"],
    "mamba2": ["mixer.weights=gate", "mixer.function=linear", "mixer.optimizer=one_step"],
    "deltanet": ["mixer.weights=uniform", "mixer.function=linear", "mixer.optimizer=sgd"],
    "gated_deltanet": ["mixer.weights=uniform", "mixer.function=linear", "mixer.optimizer=sgd",
                       "mixer.weight_decay=gated"],
    "mesa": ["mixer.weights=gate", "mixer.function=linear", "mixer.optimizer=exact"],
    "ttt_linear": ["mixer.weights=uniform", "mixer.function=linear", "mixer.optimizer=minibatch"],
    "ttt_mlp": ["mixer.weights=uniform", "mixer.function=mlp", "mixer.optimizer=minibatch"],
    "titans": ["mixer.weights=uniform", "mixer.function=mlp", "mixer.optimizer=momentum", "mixer.weight_decay=gated"],
    "softmax": ["mixer.weights=similarity", "mixer.function=nonparametric", "mixer.optimizer=exact"],
}
# a named cell whose config equals its row's builds the same layer: the function is checked once per family
QUICK = {"mamba2", "gated_deltanet", "mesa", "ttt_mlp", "titans", "softmax"}


@lru_cache(maxsize=None)  # composing is most of a config test's cost, and the named rows are composed twice
def mixer_of(*overrides):
    return validate(compose_config(["logger=disabled", f"model.width={WIDTH}", *overrides])).mixer


def call(layer, x):
    """The layer's read-out of x, compiled."""
    graphdef, state = nnx.split(layer)
    return jax.jit(lambda state: nnx.merge(graphdef, state)(x)[0])(state)


def test_the_rows_that_name_a_cell_are_the_grids_named_rows_one_a_cell():
    named = [cfg for cfg in row_configs() if cfg.cell() is not None]
    assert sorted(cfg.name for cfg in named) == sorted(NAMED)
    assert len({cfg.cell() for cfg in named}) == len(named)


@pytest.mark.parametrize("row", sorted(NAMED))
def test_a_named_cell_resolves_to_its_rows_config(row):
    named = mixer_of(f"mixer={row}")
    cell = mixer_of("mixer=regression", f"mixer.heads={named.heads}", *NAMED[row])
    # every knob of the row's YAML, and its run; the recipe is the grid's (mixer.recipe), not the row's: the cells
    # of a sweep train alike
    assert cell.recipe == type(cell.recipe)()
    assert dataclasses.replace(cell, name=row, recipe=named.recipe) == named
    # the grid's heads, not the row's, unless told: its cells differ in their knobs alone
    assert mixer_of("mixer=regression", *NAMED[row]).heads == 4
    assert mixer_of("mixer=regression", "mixer.recipe.microbatch=16", *NAMED[row]).recipe.microbatch == 16


@pytest.mark.parametrize("row", sorted(QUICK))
def test_a_named_cell_is_its_row_the_same_function_with_the_same_parameters(row):
    named = mixer_of(f"mixer={row}")
    cell = mixer_of("mixer=regression", f"mixer.heads={named.heads}", *NAMED[row])
    x = jax.random.normal(jax.random.key(1), (2, T, WIDTH))
    layers = [layer_of(c)(c, WIDTH, rope=False, rngs=nnx.Rngs(0)) for c in (cell, named)]
    trees = [jax.tree.map(jnp.shape, nnx.to_pure_dict(nnx.state(layer, nnx.Param))) for layer in layers]
    assert trees[0] == trees[1]
    y_cell, y_row = (call(layer, x) for layer in layers)
    assert float(jnp.abs(y_row).max()) > 0 and bool(jnp.array_equal(y_cell, y_row))


# cells no paper names, one per family they resolve to (the MLP cell is the example; one step of an MLP
# from its learned start is the same layer with mini_batch=null, whose memory tests/test_gradient_memory.py covers)
UNNAMED = {
    "decay-linear-sgd": (["mixer.weights=decay", "mixer.optimizer=sgd"], "FastWeightConfig"),
    "uniform-linear-exact": (["mixer.optimizer=exact"], "MesaConfig"),
    "decay-mlp-sgd": (["mixer.weights=decay", "mixer.function=mlp", "mixer.optimizer=sgd"], "TitansConfig"),
    "gate-linear-minibatch": (["mixer.weights=gate", "mixer.optimizer=minibatch"], "TitansConfig"),
}


@pytest.mark.parametrize("cell", quick_only(sorted(UNNAMED), {c for c in UNNAMED if "linear" in c}))
def test_an_unnamed_cell_resolves_to_its_family_and_its_gradients_flow(cell):
    overrides, family = UNNAMED[cell]
    cfg = mixer_of("mixer=regression", *overrides)
    assert type(cfg).__name__ == family
    layer = layer_of(cfg)(cfg, WIDTH, rope=False, rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(layer, nnx.Param, ...)
    x = jax.random.normal(jax.random.key(1), (2, T, WIDTH))

    def loss(params):
        return jnp.sum(jnp.square(nnx.merge(graphdef, params, rest)(x)[0]))

    grads = jax.jit(jax.grad(loss))(params)
    norms = [float(jnp.linalg.norm(g)) for g in jax.tree.leaves(grads)]
    assert all(jnp.isfinite(jnp.array(norms))) and sum(n > 0 for n in norms) >= len(norms) // 2


def test_the_grids_delta_cells_evaluate_as_their_keys_width_decides():
    """At width 64 the grid's four heads have keys of 16, where the delta rule evaluates in the token scan; one
    head of 64, as the named rows, evaluates chunked (FastWeightRun's eval_form=auto)."""
    for weights in ("uniform", "gate"):
        cell = mixer_of("mixer=regression", "mixer.optimizer=sgd", f"mixer.weights={weights}", "model.width=64")
        assert (cell.heads, cell.run.form, cell.for_evaluation().run.form) == (4, "chunked", "recurrent")
        one_head = mixer_of("mixer=regression", "mixer.optimizer=sgd", f"mixer.weights={weights}", "mixer.heads=1",
                            "model.width=64")
        assert one_head.for_evaluation().run.form == "chunked"
    assert mixer_of("mixer=regression", "model.width=64").for_evaluation().run.form == "chunked"  # linear attention's


def test_the_memorys_knobs_follow_the_cell():
    sgd = mixer_of("mixer=regression", "mixer.weights=decay", "mixer.function=mlp", "mixer.optimizer=sgd")
    assert (sgd.mini_batch, sgd.momentum, sgd.forget, sgd.initial) == (1, False, "fixed", "learned")
    one_step = mixer_of("mixer=regression", "mixer.function=mlp")
    assert one_step.mini_batch is None
    momentum = mixer_of("mixer=regression", "mixer.function=linear", "mixer.optimizer=momentum",
                        "mixer.mini_batch=8", "mixer.initial=zero")
    assert (momentum.mini_batch, momentum.momentum, momentum.forget, momentum.initial) == (8, True, "none", "zero")


def test_the_write_strength_is_its_own_knob():
    """auto: learned in an exact cell only where the weights come from the token (MesaNet's beta), the row's own
    elsewhere; learned or none sets it on whatever layer computes the cell."""
    exact = {weights: mixer_of("mixer=regression", "mixer.optimizer=exact", f"mixer.weights={weights}")
             for weights in ("uniform", "decay", "gate")}
    assert {w: (c.forget, c.write_strength) for w, c in exact.items()} == {
        "uniform": ("none", "one"), "decay": ("fixed", "one"), "gate": ("gate", "sigmoid")}
    assert mixer_of("mixer=regression", "mixer.optimizer=exact", "mixer.write_strength=learned").write_strength == \
        "sigmoid"
    assert mixer_of("mixer=regression", "mixer.optimizer=sgd").write_strength == "sigmoid"  # DeltaNet's beta
    assert mixer_of("mixer=regression", "mixer.optimizer=sgd", "mixer.write_strength=none").write_strength == "one"
    assert mixer_of("mixer=regression", "mixer.write_strength=learned").write_strength == "sigmoid"


@pytest.mark.parametrize("overrides, message", [
    (["mixer.function=mlp", "mixer.optimizer=exact"], "only a linear memory has a closed-form solve"),
    (["mixer.function=mlp", "mixer.initial=zero"], "every gradient of an MLP at zero is zero"),
    (["mixer.optimizer=exact", "mixer.initial=learned"], "the exact solve is the minimiser itself"),
    (["mixer.weight_decay=fixed"], "needs an iterative optimizer"),
    (["mixer.optimizer=sgd", "mixer.weights=decay", "mixer.weight_decay=gated"], "disagree"),
    (["mixer.optimizer=adam"], "mixer.optimizer='adam' is not one of"),
    (["mixer.weights=similarity", "mixer.optimizer=exact"], "similarity weights are a function of the query"),
    (["mixer.weights=similarity", "mixer.function=mlp", "mixer.optimizer=sgd"], "only a non-parametric read"),
    (["mixer.function=nonparametric", "mixer.optimizer=exact"], "every query the same fit"),
    (["mixer.weights=similarity", "mixer.function=nonparametric"], "no weights for an optimiser to step"),
    (["mixer.weights=similarity", "mixer.function=nonparametric", "mixer.optimizer=sgd"], "no weights for an"),
    (["mixer.optimizer=minibatch", "mixer.write_strength=none"], "no row's layer computes the cell (uniform, "
                                                                   "linear, minibatch) without a learned"),
    (["mixer.weights=similarity", "mixer.function=nonparametric", "mixer.optimizer=exact",
      "mixer.write_strength=learned"], "with a learned write strength"),
])
def test_a_cell_that_cannot_work_is_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as e:
        mixer_of("mixer=regression", *overrides)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_softmax_cell_is_mixer_softmax_the_same_logits():
    """The whole model, so the positions validation gives it (shortformer: softmax takes q and k inputs) are
    softmax's too."""
    cfgs = [validate(compose_config(["logger=disabled", f"model.width={WIDTH}", *overrides]))
            for overrides in (["mixer=softmax"], ["mixer=regression", *NAMED["softmax"]])]
    assert type(cfgs[1].mixer).__name__ == "SoftmaxConfig" and cfgs[0].model == cfgs[1].model
    tokens = cfgs[0].task.sample(jax.random.key(0), 2).inputs
    logits = [build(cfg).model(tokens) for cfg in cfgs]
    assert float(jnp.abs(logits[0]).max()) > 0 and bool(jnp.array_equal(*logits))


def ridge_read(q, k, v, lam):
    """o_t = G_t (H_t + Lambda)^{-1} q_t with every pair of the prefix weighted 1, written out per token."""
    T = q.shape[1]
    out = []
    for t in range(T):
        H = jnp.einsum("bshi,bshj->bhij", k[:, :t + 1], k[:, :t + 1]) + jax.vmap(jax.vmap(jnp.diag))(lam)
        G = jnp.einsum("bshi,bshj->bhij", k[:, :t + 1], v[:, :t + 1])
        x = jnp.linalg.solve(H, q[:, t][..., None])[..., 0]
        out.append(jnp.einsum("bhi,bhij->bhj", x, G))
    return jnp.stack(out, axis=1)


@pytest.mark.parametrize("strength", ["auto", "learned"])
def test_the_uniform_exact_cell_weighs_every_pair_alike(strength):
    """The ridge regression of the prefix with unit weights: no learned write strength, no `write` parameters.
    Told to learn one, the same cell weighs each pair by it, and the same check fails."""
    cfg = mixer_of("mixer=regression", "mixer.optimizer=exact", f"mixer.write_strength={strength}")
    cfg = dataclasses.replace(cfg.with_run(form="parallel"), short_conv=0, solver="cholesky")  # q, k read off the maps
    layer = layer_of(cfg)(cfg, WIDTH, rope=False, rngs=nnx.Rngs(0))
    assert cfg.forget == "none"
    assert (cfg.write_strength, hasattr(layer, "write")) == (("one", False) if strength == "auto"
                                                             else ("sigmoid", True))
    x = jax.random.normal(jax.random.key(1), (2, T, WIDTH))
    H, d = cfg.heads, WIDTH // cfg.heads
    q, k, v = (m(x).reshape(2, T, H, d) for m in (layer.q, layer.k, layer.v))
    q, k = q / jnp.linalg.norm(q, axis=-1, keepdims=True), k / jnp.linalg.norm(k, axis=-1, keepdims=True)
    lam = jnp.broadcast_to(jax.nn.softplus(layer.lambda_param[...]) + cfg.lambda_floor, (2, H, d))
    with jax.default_matmul_precision("highest"):
        o = ridge_read(q, k, v, lam)
        expected = layer.out(layer.norm(o).reshape(2, T, WIDTH))
        y = layer(x)[0]
    assert bool(jnp.allclose(y, expected, atol=1e-4)) == (strength == "auto")
