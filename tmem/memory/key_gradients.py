"""The keys' pass of the gradient memory's parallel form, with its own backward written out.

A mini-batch's writes need, for every key token j, each layer's input x_j on the
key's forward at the starting weights M_0 and the gradient delta_j of the
token's half-loss in that layer's output (tmem/memory/gradient.py). Training
then differentiates through those gradients: a second derivative of the inner
model. Autodiff of autodiff makes it from the first backward's pieces (many
small per-token and per-head reductions through the inner LayerNorm and GELU;
in Titans' step everything that flows back through these gradients took 40%
of the time, 84 ms a step with it stopped against 140). Written out here, the
forward's activations and GELU's derivatives are kept for the backward and the
LayerNorm's second derivative is a few row means: Titans' step 7% shorter,
TTT-MLP's 9% (BENCHMARKS.md, "Titans' time").

One head, one mini-batch: k, v [b, d]; the inner model's params as in
gradient.py ([d, out] weights, [out] biases), its LayerNorm's scale and bias
[d]. The model: z_l = x_l W_l + b_l, x_{l+1} = GELU(z_l) (tanh form), and the
output z_L, LayerNormed to y = n s + t with target v - k when the model has the
norm, else bare with target v. With the residual r = y - target:

    delta_L = (g - mean(g) - n mean(g n)) / sigma,   g = r s   (bare: delta_L = r)
    delta_l = (delta_{l+1} W_{l+1}^T) GELU'(z_l)

tests/test_gradient_memory.py holds the backward to autodiff's of the plain
half-loss for every inner model, and the parallel form to the definition.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from tmem.memory.ttt import ln_project, normalize

_C, _A = 0.7978845608028654, 0.044715  # the tanh GELU's sqrt(2 / pi) and cubic coefficient


def gelu_derivatives(z):
    """GELU (tanh form) at z, its first and its second derivative."""
    w = _C * (z + _A * z ** 3)
    th = jnp.tanh(w)
    sech2 = 1.0 - th * th
    dw = _C * (1.0 + 3.0 * _A * z * z)
    g1 = 0.5 * (1.0 + th) + 0.5 * z * sech2 * dw
    g2 = sech2 * (dw + 0.5 * z * (6.0 * _A * _C * z - 2.0 * th * dw * dw))
    return 0.5 * z * (1.0 + th), g1, g2


def _rows_mean(x):
    return jnp.mean(x, axis=-1, keepdims=True)


def _forward(inner, M0, k, v, ln):
    """The hidden layers' inputs, the deltas, and what the backward reads."""
    L = inner.layers
    xs, gelus, z = [k], [], None
    for layer in range(1, L + 1):
        z = xs[-1] @ M0[f"W{layer}"]
        if inner.bias:
            z = z + M0[f"b{layer}"][None]
        if layer < L:
            h, g1, g2 = gelu_derivatives(z)
            xs.append(h)
            gelus.append((g1, g2))
    if inner.norm:
        s, t = ln
        n, inv_sigma = normalize(z)
        r = n * s[None] + t[None] - (v - k)
        g = r * s[None]
        delta = ln_project(g, n) * inv_sigma
        norm = (n, inv_sigma, r, g)
    else:
        delta, norm = z - v, None
    deltas, outs = [delta], []  # outs[l]: delta_{l+2} W_{l+2}^T, delta_{l+1} before GELU'
    for layer in range(L - 1, 0, -1):
        outs.insert(0, deltas[0] @ M0[f"W{layer + 1}"].T)
        deltas.insert(0, outs[0] * gelus[layer - 1][0])
    return xs[1:], deltas, (xs, gelus, outs, norm)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def key_gradients(inner, M0: dict, k, v, ln):
    """(the hidden layers' inputs x_2.. [b, hidden], each layer's delta [b, out]) for the keys k at M_0."""
    hidden, deltas, _ = _forward(inner, M0, k, v, ln)
    return hidden, deltas


def _key_gradients_fwd(inner, M0, k, v, ln):
    hidden, deltas, saved = _forward(inner, M0, k, v, ln)
    return (hidden, deltas), (M0, k, ln, deltas, saved)


def _key_gradients_bwd(inner, res, cotangents):
    M0, k, ln, deltas, (xs, gelus, outs, norm) = res
    x_bar, d_bar = list(cotangents[0]), list(cotangents[1])
    L = inner.layers
    z_bar = [None] * L  # each layer's pre-activation's gradient
    grads = {}
    # the deltas' recurrence, from the first layer's up: each adds to the next delta's and to GELU's input's
    for layer in range(1, L):
        g1, g2 = gelus[layer - 1]
        out_bar = d_bar[layer - 1] * g1
        z_bar[layer - 1] = d_bar[layer - 1] * outs[layer - 1] * g2
        d_bar[layer] = d_bar[layer] + out_bar @ M0[f"W{layer + 1}"]
        grads[f"W{layer + 1}"] = out_bar.T @ deltas[layer]
    # the last delta from the model's output: through the LayerNorm's backward and the residual
    if inner.norm:
        s, _ = ln
        n, inv_sigma, r, g = norm
        u = d_bar[-1] * inv_sigma
        g_bar = ln_project(u, n)
        r_bar = g_bar * s[None]
        n_bar = r_bar * s[None] - u * _rows_mean(g * n) - g * _rows_mean(u * n)
        sigma_bar = -jnp.sum(d_bar[-1] * deltas[-1], axis=-1, keepdims=True) * inv_sigma
        ln_bar = (jnp.sum(g_bar * r + r_bar * n, axis=0), jnp.sum(r_bar, axis=0))
        v_bar, k_bar = -r_bar, r_bar  # the target v - k
        z_bar[-1] = ln_project(n_bar, n) * inv_sigma + sigma_bar * n / n.shape[-1]
    else:
        ln_bar = jax.tree.map(jnp.zeros_like, ln)
        v_bar, k_bar, z_bar[-1] = -d_bar[-1], jnp.zeros_like(k), d_bar[-1]
    # the forward, from the last layer down
    for layer in range(L, 0, -1):
        W, zb = M0[f"W{layer}"], z_bar[layer - 1]
        grads[f"W{layer}"] = xs[layer - 1].T @ zb + grads.get(f"W{layer}", 0.0)  # and the recurrence's part
        if inner.bias:
            grads[f"b{layer}"] = jnp.sum(zb, axis=0)
        below = zb @ W.T
        if layer > 1:
            z_bar[layer - 2] = z_bar[layer - 2] + (below + x_bar[layer - 2]) * gelus[layer - 2][0]
        else:
            k_bar = k_bar + below
    return {name: grads[name] for name in M0}, k_bar, v_bar, ln_bar


key_gradients.defvjp(_key_gradients_fwd, _key_gradients_bwd)
