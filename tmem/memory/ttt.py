"""TTT-Linear's memory (Sun et al. 2024, as the official JAX code computes it): mini-batch gradient steps.

The fast state is the inner model f(x) = x + LN(x W + b), a linear map with
a LayerNorm (per head; its scale and bias are slow weights, not updated) and
a residual. Each token writes by the gradient of its reconstruction loss

    l_j(W, b) = 1/2 || LN(k_j W + b) - (v_j - k_j) ||^2

(the target is v - k, because the residual already adds k), and reads
o_i = q_i + LN(q_i W_i + b_i). The sequence is cut into mini-batches of `b`
tokens at fixed positions (multiples of b from the first token ever read);
every gradient of a mini-batch is taken at its starting weights (W_0, b_0),
and token i of it reads the weights

    W_i = W_0 - sum_{j<=i in the mini-batch} eta_ij grad_W l_j(W_0, b_0),   eta_ij = tok_i * lr_j,

where lr_j = base_lr sigmoid(w . x_j + c) / d is the key token's learned rate and
tok_i = max(0, 1/(i+1) + offset_i) the learned factor of the reading position.
The mini-batch ends at its last token's weights. With b = 1 this is one SGD
step per token; with b > 1 it is not (the gradients do not see each other).

`recurrent` is the definition: a token loop that takes every gradient by
autodiff at the mini-batch's starting weights and builds W_i. `dual` is the
training form (the paper's dual form): within a mini-batch the updates are
never built, only the masked matmuls of q_i . k_j that read them, with the
LayerNorm's backward written out; a scan passes the weights between
mini-batches.

Because eta_ij factors into tok_i lr_j, a mini-batch cut by the end of a call
continues exactly: the state is the mini-batch's starting weights (W, b) and
the lr-weighted gradient sums (dW, db) of its tokens read so far, and `start`
(the number of them, a static count) says where in it the next call begins.

Shapes, per batch b, time t, head h: q, k, v [B, T, H, d]; lr [B, T, H];
token_lr [mini_batch]; ln_scale, ln_bias [H, d]; state (W [B, H, d, d],
b [B, H, d], dW [B, H, d, d], db [B, H, d]). W is key-major (x W, x a row), as
the official code and the fast-weight rows store it.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

LN_EPS = 1e-6  # flax's LayerNorm default, the official inner norm's


def normalize(z):
    """(z - mean) / sigma over the last axis, and 1 / sigma, sigma = sqrt(var + eps)."""
    mu = jnp.mean(z, axis=-1, keepdims=True)
    inv = jax.lax.rsqrt(jnp.mean(jnp.square(z - mu), axis=-1, keepdims=True) + LN_EPS)
    return (z - mu) * inv, inv


def ln_project(g, x_hat):
    """g - mean(g) - x_hat mean(g x_hat) over the last axis: LN's backward before its 1 / sigma, for g the output's
    gradient times the scale (tmem.memory.key_gradients takes the same projection in its second derivative)."""
    return g - jnp.mean(g, axis=-1, keepdims=True) - x_hat * jnp.mean(g * x_hat, axis=-1, keepdims=True)


def layer_norm(z, scale, bias):
    """LN over the last axis with a scale and bias: (z - mean) / sqrt(var + eps) * scale + bias."""
    return normalize(z)[0] * scale + bias


def inner_loss(W, b, k, v, scale, bias, precision=None):
    """One token's reconstruction loss 1/2 ||LN(k W + b) - (v - k)||^2 (one head: W [d, d], vectors [d])."""
    z = jnp.dot(k, W, precision=precision) + b
    return 0.5 * jnp.sum(jnp.square(layer_norm(z, scale, bias) - (v - k)))


def positions(start: int, T: int, mini_batch: int):
    """Each token's place in its mini-batch [T], and whether it closes one [T]: static, from the count read."""
    i = (start + jnp.arange(T)) % mini_batch
    return i, i == mini_batch - 1


def recurrent(q, k, v, *, lr, token_lr, ln_scale, ln_bias, state, mini_batch: int, start: int = 0,
              precision=None):
    """The definition: token by token, gradients by autodiff at the mini-batch's starting weights.

    Returns o [B, T, H, d] and the final state (W, b, dW, db).
    """
    B, T, H, d = q.shape
    place, closes = positions(start, T, mini_batch)
    tok = token_lr[place]
    grad = jax.grad(inner_loss, argnums=(0, 1))

    def one_head(state, x, scale, bias):  # one example, one head
        W, b, dW, db = state
        q_t, k_t, v_t, lr_t, tok_t, close = x
        gW, gb = grad(W, b, k_t, v_t, scale, bias, precision)
        dW, db = dW + lr_t * gW, db + lr_t * gb
        W_t, b_t = W - tok_t * dW, b - tok_t * db
        o = q_t + layer_norm(jnp.dot(q_t, W_t, precision=precision) + b_t, scale, bias)
        keep = lambda new, old: jnp.where(close, new, old)  # noqa: E731  a closed mini-batch starts the next
        return (keep(W_t, W), keep(b_t, b), keep(jnp.zeros_like(dW), dW), keep(jnp.zeros_like(db), db)), o

    heads = jax.vmap(one_head, in_axes=((0, 0, 0, 0), (0, 0, 0, 0, None, None), 0, 0))  # over H
    batch = jax.vmap(heads, in_axes=((0, 0, 0, 0), (0, 0, 0, 0, None, None), None, None))  # over B

    def step(state, x):
        return batch(state, x, ln_scale, ln_bias)

    time_major = lambda x: jnp.moveaxis(x, 1, 0)  # noqa: E731
    xs = (*map(time_major, (q, k, v, lr)), tok, closes)
    final, o = jax.lax.scan(step, tuple(state), xs)
    return time_major(o), final


def _ln_with_vjp(z, scale, bias):
    """LN(z) and its backward dz(dy) = (g - mean(g) - x_hat mean(g x_hat)) / sigma, g = dy * scale, written out."""
    x_hat, inv = normalize(z)

    def vjp(dy):
        return inv * ln_project(dy * scale, x_hat)

    return x_hat * scale + bias, vjp


def dual(q, k, v, *, lr, token_lr, ln_scale, ln_bias, state, mini_batch: int, start: int = 0, precision=None):
    """The training form, equal to `recurrent`: within a mini-batch, with G_j = dl_j/dz_j at (W_0, b_0),

        z_bar_i = q_i W_0 + b_0 - tok_i (q_i dW + db) - sum_{j<=i} tok_i lr_j (q_i . k_j + 1) G_j,

    (dW, db the sums carried in from an earlier call), o_i = q_i + LN(z_bar_i), and the mini-batch closes
    with W_0 - tok_last (dW + sum_j lr_j k_j G_j^T). The sequence is padded to whole mini-batches with
    tokens of rate 0, which write nothing, and their reads are dropped.
    """
    einsum = partial(jnp.einsum, precision=precision)
    B, T, H, d = q.shape
    n = -(-(start + T) // mini_batch)
    pad = (start, n * mini_batch - start - T)

    def blocks(x):  # [B, T, H, ...] -> [n, B, H, b, ...]
        x = jnp.pad(x, [(0, 0), pad] + [(0, 0)] * (x.ndim - 2))
        return jnp.moveaxis(x.reshape(B, n, mini_batch, H, *x.shape[3:]), (1, 3), (0, 2))

    Q, K, V, L = map(blocks, (q, k, v, lr))  # L [n, B, H, b]
    scale, bias = ln_scale[None, :, None], ln_bias[None, :, None]  # [1, H, 1, d]: broadcast over B and tokens
    tok = token_lr.reshape(1, 1, -1, 1)  # the reading position's factor, down the rows i
    causal = jnp.tril(jnp.ones((mini_batch, mini_batch), L.dtype))
    eta = causal[None, None, None] * L[..., None, :] * tok[None]  # [n, B, H, b, b]: tok_i lr_j for j <= i

    def read_and_write(carry, x):
        """One mini-batch: its reads, and the sums of its writes (W, b still its starting weights)."""
        W, b, dW, db = carry
        Qn, Kn, Vn, Ln, En = x
        z, vjp = _ln_with_vjp(einsum("bhjk,bhkl->bhjl", Kn, W) + b[:, :, None], scale, bias)
        G = vjp(z - (Vn - Kn))  # [B, H, b, d]: dl_j / dz_j at the starting weights
        scores = En * (einsum("bhik,bhjk->bhij", Qn, Kn) + 1.0)
        z_bar = (einsum("bhik,bhkl->bhil", Qn, W) + b[:, :, None]
                 - tok * (einsum("bhik,bhkl->bhil", Qn, dW) + db[:, :, None])
                 - einsum("bhij,bhjl->bhil", scores, G))
        o = Qn + layer_norm(z_bar, scale, bias)
        dW = dW + einsum("bhj,bhjk,bhjl->bhkl", Ln, Kn, G)
        db = db + einsum("bhj,bhjl->bhl", Ln, G)
        return (W, b, dW, db), o

    def close(carry):
        W, b, dW, db = carry
        last = token_lr[-1]
        return W - last * dW, b - last * db, jnp.zeros_like(dW), jnp.zeros_like(db)

    def step(carry, x):
        carry, o = read_and_write(carry, x)
        return close(carry), o

    xs = (Q, K, V, L, eta)
    carry = tuple(state)
    outs = []
    if n > 1:
        carry, o = jax.lax.scan(step, carry, jax.tree.map(lambda x: x[:-1], xs))
        outs.append(o)
    carry, o = read_and_write(carry, jax.tree.map(lambda x: x[-1], xs))
    outs.append(o[None])
    if (start + T) % mini_batch == 0:  # the last mini-batch is whole: its weights are the next one's start
        carry = close(carry)
    o = jnp.concatenate(outs, axis=0)  # [n, B, H, b, d]
    o = jnp.moveaxis(o, (0, 2), (1, 3)).reshape(B, n * mini_batch, H, d)[:, start:start + T]
    return o, carry
