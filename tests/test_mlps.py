"""The MLPs beyond the dense one: the mixture of experts against its dense loop, product keys against brute force."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import TINY, compose_config, quick_only
from tmem.config import ConfigError, validate
from tmem.mlps import MoEConfig, PKMConfig
from tmem.mlps.dense import SCORES
from tmem.mlps.moe import MoE, balance_loss, dense_oracle, grouped, route
from tmem.mlps.pkm import ProductKeyMemory, brute_force_topk, memory_read, product_topk

HIGHEST = jax.lax.Precision.HIGHEST


def test_relu3_is_the_cubed_relu():
    s = jnp.array([-2.0, -0.5, 0.0, 0.5, 2.0])
    np.testing.assert_allclose(SCORES["relu3"](s), [0, 0, 0, 0.125, 8])


def _experts(E, D, hidden, gated, bias, key):
    k = jax.random.split(key, 4)
    n_in = 2 * hidden if gated else hidden
    experts = {"w_in": jax.random.normal(k[0], (E, D, n_in)), "w_out": jax.random.normal(k[1], (E, hidden, D))}
    if bias:
        experts |= {"b_in": jax.random.normal(k[2], (E, n_in)), "b_out": jax.random.normal(k[3], (E, D))}
    return experts


# (experts, top_k, tokens, block, score, bias): blocks that every count fills unevenly, one row a block, an expert
# alone, a gated score with biases
GROUPED = [(4, 2, 13, 3, "relu", False), (8, 3, 16, 1, "gelu", False), (1, 1, 5, 4, "relu3", False),
           (5, 2, 9, 16, "swiglu", True)]


@pytest.mark.parametrize("E,k,N,block,score,bias", quick_only(GROUPED, {"4-2-13-3-relu-False", "5-2-9-16-swiglu-True"},
                                                              ids=lambda c: "-".join(map(str, c))))
def test_the_grouped_form_equals_every_expert_gated(E, k, N, block, score, bias):
    """Outputs and gradients (tokens, gates, every expert's weights) of the training form equal the dense loop."""
    D = 6
    keys = jax.random.split(jax.random.key(E * 100 + N), 3)
    x = jax.random.normal(keys[0], (N, D))
    probs = jax.nn.softmax(jax.random.normal(keys[1], (N, E)))
    index, gate = route(probs, k, renormalize=True)
    experts = _experts(E, D, 3, score == "swiglu", bias, keys[2])
    with jax.default_matmul_precision("highest"):
        fast, oracle = (jax.jit(f, static_argnums=(4,))(x, index, gate, experts, score) for f in
                        (lambda *a: grouped(*a, block), dense_oracle))
        np.testing.assert_allclose(fast, oracle, rtol=1e-5, atol=1e-5)
        loss = lambda f: lambda x, gate, experts: jnp.sum(jnp.sin(f(x, index, gate, experts)))  # noqa: E731
        g_fast, g_oracle = (jax.jit(jax.grad(loss(f), argnums=(0, 1, 2)))(x, gate, experts) for f in
                            (lambda *a: grouped(*a, score, block), lambda *a: dense_oracle(*a, score)))
    for a, b in zip(jax.tree.leaves(g_fast), jax.tree.leaves(g_oracle)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_the_layer_equals_its_dense_loop_in_outputs_and_gradients_of_every_parameter():
    """The router's gradient too: it reaches the router through the gates."""
    layer = MoE(MoEConfig(experts=4, top_k=2, expansion=1.0, block=4), 8, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (2, 7, 8))

    def oracle(m, x):
        index, gate, _ = m.route(x.reshape(-1, 8))
        return dense_oracle(x.reshape(-1, 8), index, gate, m.experts(), "relu").reshape(x.shape)

    with jax.default_matmul_precision("highest"):
        np.testing.assert_allclose(layer(x), oracle(layer, x), rtol=1e-5, atol=1e-5)
        grads = [nnx.grad(lambda m: jnp.sum(jnp.sin(f(m, x))))(layer) for f in (lambda m, x: m(x), oracle)]
    assert float(jnp.abs(grads[0]["router"]["kernel"][...]).max()) > 0
    for a, b in zip(jax.tree.leaves(nnx.state(grads[0])), jax.tree.leaves(nnx.state(grads[1]))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_gates_are_renormalised_over_the_chosen_or_the_router_probabilities():
    probs = jnp.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
    index, gate = route(probs, 2, renormalize=True)
    np.testing.assert_array_equal(index, [[0, 1], [2, 0]])
    np.testing.assert_allclose(gate, [[0.625, 0.375], [0.8 / 0.9, 0.1 / 0.9]], rtol=1e-6)
    np.testing.assert_allclose(route(probs, 2, renormalize=False)[1], [[0.5, 0.3], [0.8, 0.1]])


def test_the_balance_loss_on_a_hand_made_routing():
    """E sum_e f_e P_e: 1 when tokens and probabilities are spread evenly, E when one expert takes all."""
    p = jnp.array([[0.7, 0.1, 0.1, 0.1], [0.1, 0.7, 0.1, 0.1], [0.7, 0.1, 0.1, 0.1], [0.7, 0.1, 0.1, 0.1]])
    # top-1 picks experts 0, 1, 0, 0: f = (3/4, 1/4, 0, 0); P = (0.55, 0.25, 0.1, 0.1)
    assert float(balance_loss(p, jnp.array([[0], [1], [0], [0]]))) == pytest.approx(4 * (0.75 * 0.55 + 0.25 * 0.25))
    uniform = jnp.full((4, 4), 0.25)
    assert float(balance_loss(uniform, jnp.arange(4)[:, None])) == pytest.approx(1.0)
    one_hot = jnp.eye(4)[jnp.zeros(4, int)]
    assert float(balance_loss(one_hot, jnp.zeros((4, 1), int))) == pytest.approx(4.0)
    # two choices a token: f counts both, so an even spread over the pairs is 1 again
    assert float(balance_loss(uniform, jnp.array([[0, 1], [2, 3], [1, 0], [3, 2]]))) == pytest.approx(1.0)


def _step_loss(*overrides):
    from tmem.model import build_model
    from tmem.train.step import make_loss

    cfg = validate(compose_config([*TINY, *overrides]))
    graphdef, params, rest = nnx.split(build_model(cfg, cfg.task), nnx.Param, ...)
    return jax.jit(make_loss(graphdef, cfg.task))(params, rest, cfg.task.sample(jax.random.key(0), 4))


def test_the_train_loss_adds_the_weighted_balance_loss_of_every_layer_and_reports_their_mean():
    """Switch's sum over the layers, here the 3 applications of one looped block; the `loss` metric is the task's."""
    loss, metrics = _step_loss("mlp=moe", "mlp.balance_weight=0.5", "model.depth=3", "model.tie_blocks=true")
    assert float(metrics["balance_loss"]) > 1.0  # a random router is not perfectly balanced
    assert float(loss) == pytest.approx(float(metrics["loss"]) + 0.5 * 3 * float(metrics["balance_loss"]), rel=1e-6)
    loss, metrics = _step_loss("mlp=relu")
    assert "balance_loss" not in metrics and float(loss) == float(metrics["loss"])


@pytest.mark.parametrize("overrides,message", [
    (["mlp.top_k=9"], "mlp.top_k=9 must be in 1..mlp.experts=8"),
    (["mlp.top_k=1"], "mlp.renormalize=true with mlp.top_k=1 gates every token by 1"),
    (["mlp.score=exp"], "mlp.score='exp' is not one of"),
    (["mlp=pkm", "mlp.key_width=7"], "mlp.key_width=7 must be a positive even number"),
    (["mlp=pkm", "mlp.top_k=40"], "mlp.top_k=40 must be in 1..mlp.keys=32"),
    (["mlp=pkm", "model.width=15", "mixer.heads=3"], "mlp.key_width=null takes the model width 15"),
])
def test_a_bad_mixture_or_memory_is_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as e:
        validate(compose_config([*TINY, "mlp=moe", *overrides]))
    assert "\n" not in str(e.value)


# (tokens, heads, sub-keys n, top_k, query width)
SEARCHES = [(7, 1, 8, 3, 6), (5, 2, 16, 4, 8), (4, 3, 5, 5, 4)]


@pytest.mark.parametrize("N,H,n,k,d", quick_only(SEARCHES, {"5-2-16-4-8"}, ids=lambda c: "-".join(map(str, c))))
def test_product_keys_find_the_brute_force_top_k(N, H, n, k, d):
    keys = jax.random.split(jax.random.key(n), 3)
    q, c1, c2 = (jax.random.normal(kk, s) for kk, s in zip(keys, [(N, H, d), (H, n, d // 2), (H, n, d // 2)]))
    with jax.default_matmul_precision("highest"):
        fast, brute = product_topk(q, c1, c2, k), brute_force_topk(q, c1, c2, k)
    np.testing.assert_array_equal(fast[1], brute[1])  # scores of random keys have no ties: the same order
    np.testing.assert_allclose(fast[0], brute[0], rtol=1e-5, atol=1e-5)


def test_the_memory_layer_equals_its_brute_force_read_in_outputs_and_gradients():
    layer = ProductKeyMemory(PKMConfig(keys=6, top_k=4, heads=2), 8, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(2), (3, 5, 8))

    def brute(m, x):
        q = m.query(x).reshape(3, 5, 2, -1)
        scores, index = brute_force_topk(q, m.sub_keys_1[...], m.sub_keys_2[...], 4)
        return memory_read(scores, index, m.values[...])

    with jax.default_matmul_precision("highest"):
        np.testing.assert_allclose(layer(x), brute(layer, x), rtol=1e-5, atol=1e-5)
        grads = [nnx.jit(nnx.grad(lambda m: jnp.sum(jnp.sin(f(m, x)))))(layer) for f in (lambda m, x: m(x), brute)]
    for a, b in zip(jax.tree.leaves(nnx.state(grads[0])), jax.tree.leaves(nnx.state(grads[1]))):
        assert float(jnp.abs(b).max()) > 0
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    # each token reads heads x top_k = 8 of the 36 values: the others get no gradient
    assert int((jnp.abs(grads[0]["values"][...]).sum(-1) > 0).sum()) <= 3 * 5 * 8
