"""TTT-Linear's memory (tmem/memory/ttt.py): the dual form equals the mini-batch definition; b = 1 is per-token SGD."""

from functools import partial

import jax
import jax.numpy as jnp
import pytest

from tmem.memory import ttt

B, H, D = 2, 2, 4
T, MB = 13, 4  # no whole number of mini-batches
FULL = jax.lax.Precision.HIGHEST


def rel_err(a, b):
    """||a - b|| / ||b||, and 0 when both are zero (the sums of a mini-batch that closed)."""
    diff, norm = float(jnp.linalg.norm((a - b).ravel())), float(jnp.linalg.norm(b.ravel()))
    return diff / norm if norm else diff


def inputs(mini_batch=MB, start=0, seed=0):
    ks = jax.random.split(jax.random.key(seed), 10)
    normal = lambda i, shape, s=1.0: s * jax.random.normal(ks[i], shape)  # noqa: E731
    open_sums = start % mini_batch != 0  # a state cut inside a mini-batch carries that mini-batch's sums
    state = (normal(6, (B, H, D, D), 0.3), normal(7, (B, H, D), 0.1),
             normal(8, (B, H, D, D), 0.1 * open_sums), normal(9, (B, H, D), 0.1 * open_sums))
    return dict(q=normal(0, (B, T, H, D)), k=normal(1, (B, T, H, D)), v=normal(2, (B, T, H, D)),
                lr=jax.nn.sigmoid(normal(3, (B, T, H))) / D,
                token_lr=jnp.maximum(1 / jnp.arange(1, mini_batch + 1) + normal(4, (mini_batch,), 0.1), 0),
                ln_scale=1 + normal(5, (H, D), 0.1), ln_bias=normal(5, (H, D), 0.1)[::-1], state=state)


@partial(jax.jit, static_argnums=0, static_argnames=("mini_batch", "start"))
def value_and_grads(form, x, **kw):
    """(o, state) and the gradients of a random projection of both w.r.t. every input."""
    names = list(x)
    do = jax.random.normal(jax.random.key(7), (B, T, H, D))
    dS = [jax.random.normal(jax.random.key(8 + i), s.shape) for i, s in enumerate(x["state"])]

    def loss(*args):
        o, S = form(**dict(zip(names, args)), precision=FULL, **kw)
        return jnp.sum(o * do) + sum(jnp.sum(s * d) for s, d in zip(S, dS)), (o, S)

    grads, out = jax.grad(loss, argnums=tuple(range(len(names))), has_aux=True)(*x.values())
    return out, dict(zip(names, grads))


@pytest.mark.parametrize("start", [0, pytest.param(3, marks=pytest.mark.slow)])  # from zero quick; cut in the full
def test_the_dual_form_equals_the_definition_outputs_state_and_gradients(start):
    """From the start of a mini-batch, and from a state cut 3 tokens into one (the continuation)."""
    x = inputs(start=start)
    (o_ref, S_ref), g_ref = value_and_grads(ttt.recurrent, x, mini_batch=MB, start=start)
    (o, S), g = value_and_grads(ttt.dual, x, mini_batch=MB, start=start)
    assert rel_err(o, o_ref) <= 1e-5
    for a, b in zip(S, S_ref):
        assert rel_err(a, b) <= 1e-5
    for name in ("q", "k", "v", "lr", "token_lr", "ln_scale", "ln_bias"):
        assert rel_err(g[name], g_ref[name]) <= 1e-5, name
    for a, b in zip(g["state"], g_ref["state"]):
        assert rel_err(a, b) <= 1e-5


@jax.jit
def sgd_per_token(x):
    """The inner loop written plainly, for one example and head at a time: W <- W - eta_t dl_t/dW at the current
    weights, eta_t = token_lr[0] * lr_t, then the read q_t + LN(q_t W + b). Its own LayerNorm and autodiff."""
    def ln(z, s, c):
        z = z - z.mean()
        return z / jnp.sqrt(jnp.mean(z * z) + 1e-6) * s + c

    def run(W, b, q, k, v, lr, s, c):
        outs = []
        for t in range(T):
            loss = lambda W, b: 0.5 * jnp.sum((ln(jnp.dot(k[t], W, precision=FULL) + b, s, c)  # noqa: E731
                                               - (v[t] - k[t])) ** 2)
            gW, gb = jax.grad(loss, argnums=(0, 1))(W, b)
            eta = x["token_lr"][0] * lr[t]
            W, b = W - eta * gW, b - eta * gb
            outs.append(q[t] + ln(jnp.dot(q[t], W, precision=FULL) + b, s, c))
        return jnp.stack(outs), W, b

    per_head = jax.vmap(run, in_axes=(0, 0, 1, 1, 1, 1, 0, 0), out_axes=(1, 0, 0))
    return jax.vmap(per_head, in_axes=(0, 0, 0, 0, 0, 0, None, None))(
            x["state"][0], x["state"][1], x["q"], x["k"], x["v"], x["lr"], x["ln_scale"], x["ln_bias"])


@pytest.mark.slow  # 11 s; the quick subset keeps the dual form against its definition
def test_mini_batches_of_one_token_are_sgd_per_token_and_larger_ones_are_not():
    x = inputs(mini_batch=1)
    o_ref, W_ref, b_ref = sgd_per_token(x)
    (o, (W, b, dW, _)), _ = value_and_grads(ttt.dual, x, mini_batch=1)
    assert rel_err(o, o_ref) <= 1e-5 and rel_err(W, W_ref) <= 1e-5 and rel_err(b, b_ref) <= 1e-5
    assert float(jnp.abs(dW).max()) == 0.0  # every mini-batch closed
    # with b = 4 and the same first rate, gradients taken at a mini-batch's starting weights differ from SGD's
    wide = dict(x, token_lr=jnp.full((MB,), x["token_lr"][0]))
    (o4, _), _ = value_and_grads(ttt.dual, wide, mini_batch=MB)
    assert rel_err(o4, o_ref) > 1e-3
