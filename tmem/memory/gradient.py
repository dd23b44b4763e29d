"""A memory that is a small model trained by gradient steps inside the forward pass (TTT, Titans, the grid's cells).

The slides' test-time regression, min over m of 1/2 sum_i gamma_i ||v_i - m(k_i)||^2,
solved by an iterative optimiser: the fast state is the inner model m (a linear
map or a two-layer MLP, per head), and every token writes by the gradient of
its half-loss

    l_j(M) = 1/2 || g(k_j; M) - target_j ||^2,

g the inner model, optionally LayerNormed with a slow scale and bias and with a
residual (TTT's f(x) = x + LN(g(x)), whose target is then v - k), else the bare
model with target v. Reads are m(q_i) at the weights after token i.

The optimiser, per token t (one head, one example): the gradient is taken at
the weights M_0 the current mini-batch started from (mini-batch gradient
descent; b = 1 is one SGD step per token), an optional momentum S, and an
optional decay of the memory a_t = 1 - alpha_t (weight decay, Titans' forget
gate, a decaying state), with a key token's rate theta_t:

    S_t = eta_t S_{t-1} - theta_t grad l_t(M_0)          (no momentum: S_t = -theta_t grad l_t(M_0))
    M_t = a_t M_{t-1} + S_t
    read with R_t = A_t M_0 + tok_i (M_t - A_t M_0),   A_t = prod of a since M_0,

where tok_i is TTT's learned factor of the reading position i in its
mini-batch (1 for every other row), and a mini-batch closes with M_0 <- R of
its last token. With tok = 1, R_t = M_t. `mini_batch=None` is one mini-batch
that never closes: one gradient step from the initial memory.

`recurrent` is the definition: a token loop, gradients by autodiff. `parallel`
is the training form: mini-batch by mini-batch (a scan over them in a long
call), no per-token weights built. Every gradient of a linear layer is an
outer product x_j delta_j^T (x_j the layer's input on the key's forward at
M_0, delta_j its output's gradient: tmem/memory/key_gradients.py, whose
backward is written out), so with U_i = M_i - A_i M_0 a layer's read
at token i is

    z_i = x~_i (c0_i W_0 + c1_i U_0 + c2_i S_0) + (same for the bias) - sum_{j<=i} K_ij (x~_i . x_j + 1) delta_j,

x~_i the layer's input on the query's read, and K = diag(tok) C with C_ij the
weight of token j's gradient in U_i: C = D (live E) diag(theta), D_il the decay
from l to i, E_lj the momentum from j to l. The sequence is padded to whole
mini-batches with tokens that write nothing; their reads are dropped.

The state between calls is (M_0, U, A, S): the open mini-batch's starting
weights, the change since then (decayed), the decay product and the momentum,
and `start` (a static count) says where in a mini-batch the call begins. A
call that begins a mini-batch takes U = 0 and A = 1, as every state there has
them, and neither reads them nor passes them a gradient. A call without a state
starts from the `initial` model ([H, ...], the same for every example).
Params of the inner model are a dict: W1, b1 (linear), and W2, b2 (MLP, GELU
between); each [H, ...] once, [B, H, ...] in the state. Shapes: q, k, v
[B, T, H, d]; theta, log_a, log_eta [B, T, H]; tok [mini_batch]; ln (scale,
bias) [H, d] each.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp

from tmem.memory.key_gradients import key_gradients
from tmem.memory.reads import at_positions
from tmem.memory.ttt import layer_norm

FUNCTIONS = ("linear", "mlp")
# a call of at most this many mini-batches runs each as its own code, a longer one scans over the middle ones:
# XLA's CPU loop stacks and copies what each step saves for the backward pass, which on the default job's 4
# mini-batches cost more time than 4 copies of the block, to run and to compile; at 8 the copies run faster
# but compile half as long again (BENCHMARKS.md)
UNROLLED = 4
# what each block keeps for the backward pass (`saved`): all its intermediates, or its matmuls' outputs only, its
# elementwise work computed again there (a jax.checkpoint policy). The same function either way; which is quicker
# depends on the memory's size: on a CPU, Titans' step (heads of 32, hidden 128, momentum) takes 0.79 of its time
# with matmuls, TTT-MLP's (heads of 16) 1.04, no gain (BENCHMARKS.md, "Titans' time")
SAVED = {"all": None, "matmuls": jax.checkpoint_policies.dots_saveable}


@dataclasses.dataclass(frozen=True)
class Inner:
    """The inner model's shape: linear (x W1 + b1) or MLP (GELU(x W1 + b1) W2 + b2), biases optional, and
    whether it is wrapped as x + LN(g(x)) (TTT's inner norm and residual)."""

    function: str = "linear"
    bias: bool = True
    norm: bool = True

    @property
    def layers(self) -> int:
        return 1 if self.function == "linear" else 2


def init_params(inner: Inner, H: int, d: int, hidden: int, key, std: float, zero: bool = False) -> dict:
    """The initial inner model per head: weights ~ N(0, std) (zero: all zeros), biases zero."""
    shapes = [(d, d)] if inner.layers == 1 else [(d, hidden), (hidden, d)]
    params = {}
    for layer, (shape, k) in enumerate(zip(shapes, jax.random.split(key, len(shapes))), start=1):
        params[f"W{layer}"] = jnp.zeros((H, *shape)) if zero else std * jax.random.normal(k, (H, *shape))
        if inner.bias:
            params[f"b{layer}"] = jnp.zeros((H, shape[1]))
    return params


def model(inner: Inner, params: dict, x, ln):
    """g(x) (LNed when inner.norm): one head, x [..., d]."""
    h = x
    for layer in range(1, inner.layers + 1):
        z = h @ params[f"W{layer}"]
        if inner.bias:
            z = z + jnp.broadcast_to(params[f"b{layer}"], z.shape)
        h = jax.nn.gelu(z, approximate=True) if layer < inner.layers else z
    return _layer_norm(h, ln) if inner.norm else h


def _layer_norm(h, ln):
    """TTT's inner LayerNorm with its slow scale and bias [d], over a token [d] or a mini-batch [b, d]."""
    return layer_norm(h, *(jnp.broadcast_to(p, h.shape) for p in ln))


def loss(inner: Inner, params: dict, k, v, ln):
    """The half-loss summed over the tokens of k, v [..., d] (each token's loss depends on its own row only)."""
    y = model(inner, params, k, ln)
    target = v - k if inner.norm else v
    return 0.5 * jnp.sum(jnp.square(y - target))


def read(inner: Inner, q, y):
    """The read from g(q): plus the residual q when the model has one."""
    return q + y if inner.norm else y


def initial_state(params: dict, B: int, momentum: bool):
    """(M_0, U, A, S) for B examples from the initial model per head: no change yet, no decay, no momentum."""
    M0 = jax.tree.map(lambda p: jnp.broadcast_to(p[None], (B, *p.shape)), params)
    zeros = jax.tree.map(jnp.zeros_like, M0)
    H = next(iter(params.values())).shape[0]
    return M0, zeros, jnp.ones((B, H)), (zeros if momentum else None)


def _combine(c, trees):
    """sum_n c[n] trees[n], leafwise; c [n] scalars, a None tree skipped."""
    out = None
    for cn, tree in zip(c, trees):
        if tree is None:
            continue
        term = jax.tree.map(lambda x: cn * x, tree)
        out = term if out is None else jax.tree.map(jnp.add, out, term)
    return out


def recurrent(q, k, v, *, inner: Inner, theta, log_a=None, log_eta=None, tok=None, ln=None, state=None,
              initial: dict | None = None, mini_batch: int | None, start: int = 0, read_at=None):
    """The definition: token by token, each gradient by autodiff at its mini-batch's starting weights.

    state: the (M_0, U, A, S) to go on from; None: `initial`'s (`initial_state`). Returns o [B, T, H, d] (at
    read_at [B, Q]: [B, Q, H, d], read everywhere and taken there) and the final state (M_0, U, A, S).
    """
    B, T, H, d = q.shape
    if mini_batch is None and tok is not None:
        raise ValueError("tok needs mini-batches: one endless mini-batch has no reading positions to weigh")
    momentum = log_eta is not None
    state = initial_state(initial, B, momentum) if state is None else state
    b = mini_batch or start + T  # None: one mini-batch that never closes
    place = (start + jnp.arange(T)) % b
    closes = (place == b - 1) & (mini_batch is not None)
    tok_t = jnp.ones((T,)) if tok is None else tok[place]
    log_a = jnp.zeros((B, T, H)) if log_a is None else log_a
    log_eta = jnp.zeros((B, T, H)) if log_eta is None else log_eta
    ln = (jnp.ones((H, d)), jnp.zeros((H, d))) if ln is None else ln
    grad = jax.grad(lambda p, k_t, v_t, ln_h: loss(inner, p, k_t, v_t, ln_h))

    def one_head(carry, x, ln_h):
        M0, U, A, S = carry
        q_t, k_t, v_t, theta_t, la_t, le_t, tok_i, close = x
        g = grad(M0, k_t, v_t, ln_h)
        a = jnp.exp(la_t)
        if momentum:
            S = jax.tree.map(lambda s, gi: jnp.exp(le_t) * s - theta_t * gi, S, g)
            U = jax.tree.map(lambda u, s: a * u + s, U, S)
        else:
            U = jax.tree.map(lambda u, gi: a * u - theta_t * gi, U, g)
        A = a * A
        R = jax.tree.map(lambda m0, u: A * m0 + tok_i * u, M0, U)
        y = model(inner, R, q_t, ln_h)
        o = read(inner, q_t, y)
        keep = lambda new, old: jax.tree.map(lambda n, o_: jnp.where(close, n, o_), new, old)  # noqa: E731
        carry = (keep(R, M0), keep(jax.tree.map(jnp.zeros_like, U), U), jnp.where(close, 1.0, A), S)
        return carry, o

    x_axes = (0, 0, 0, 0, 0, 0, None, None)
    heads = jax.vmap(one_head, in_axes=((0, 0, 0, 0), x_axes, 0))  # over H
    batch = jax.vmap(heads, in_axes=((0, 0, 0, 0), x_axes, None))  # over B
    time_major = lambda x: jnp.moveaxis(x, 1, 0)  # noqa: E731
    xs = (*map(time_major, (q, k, v, theta, log_a, log_eta)), tok_t, closes)
    final, o = jax.lax.scan(lambda c, x: batch(c, x, ln), tuple(state), xs)
    return at_positions(time_major(o), read_at), final


def _coefficients(theta, log_a, log_eta, live, tok):
    """For one mini-batch of one head (each [b]): the read's coefficients c0 (of M_0, times A_0 later),
    c1 (of U_0), c2 (of S_0), K [b, b] (of each gradient in the read), and the end state's A_b, m_b, C_b [b]
    and the momentum's P_b, E_b theta [b]."""
    b = theta.shape[0]
    causal = jnp.tril(jnp.ones((b, b), bool))
    La = jnp.cumsum(log_a)
    D = jnp.where(causal, jnp.exp(jnp.where(causal, La[:, None] - La[None, :], 0.0)), 0.0)  # decay from l to i
    A = jnp.exp(La)
    if log_eta is None:
        C = D * theta[None, :]
        m = P = Etheta = None
    else:
        Le = jnp.cumsum(log_eta)
        E = jnp.where(causal, jnp.exp(jnp.where(causal, Le[:, None] - Le[None, :], 0.0)), 0.0)
        P = jnp.exp(Le)
        m = D @ (live * P)
        C = (D @ (live[:, None] * E)) * theta[None, :]
        Etheta = E[-1] * theta
    return dict(A=A, tokA=tok * A, tokm=None if m is None else tok * m, K=tok[:, None] * C, C_end=C[-1],
                m_end=None if m is None else m[-1], P_end=None if P is None else P[-1], Etheta_end=Etheta)


def _block(inner: Inner, carry, x, ln, close: bool, fresh: bool):
    """One mini-batch of one head: its reads, and the state after it (closed or not). fresh: the block starts a
    mini-batch (U_0 = 0, A_0 = 1, as after every close), so the terms of U_0 are left out.

    Its reads are its own b queries in order, or (`rows` [Q], the places in the block of Q queries q [Q, d],
    `here` [Q] whether each is in this block) the reads of those queries as if each were at its place here,
    zero where it is not."""
    M0, U0, A0, S0 = carry
    q, k, v, theta, log_a, log_eta, live, rows, here, tok = x
    cf = _coefficients(theta, log_a, log_eta, live, tok)
    at = (lambda c: c) if rows is None else (lambda c: c[rows])  # noqa: E731  each read's row of a coefficient
    L = inner.layers
    # the keys' forward at M_0, and each layer's output gradient delta_j (per token: the loss is a sum of rows)
    hidden, deltas = key_gradients(inner, M0, k, v, ln)
    xs = [k, *hidden]
    # the starting matrices a read multiplies, and their coefficients per token: M_0 (A_0 A_i), U_0 (tok_i A_i)
    # unless fresh, S_0 (tok_i m_i) with momentum
    starts = [(M0, at(cf["A"] if fresh else A0 * cf["A"]))]
    if not fresh:
        starts.append((U0, at(cf["tokA"])))
    if S0 is not None:  # None: no momentum, or none yet (the initial state's)
        starts.append((S0, at(cf["tokm"])))
    h = q
    for layer in range(1, L + 1):
        W, bias = f"W{layer}", f"b{layer}"
        X, delta = xs[layer - 1], deltas[layer - 1]
        n_out = M0[W].shape[-1]
        # one matmul over the starting matrices side by side, then each block of columns scaled per token
        y = h @ jnp.concatenate([tree[W] for tree, _ in starts], axis=-1)
        z = sum(c[:, None] * y[:, i * n_out:(i + 1) * n_out] for i, (_, c) in enumerate(starts))
        scores = at(cf["K"]) * (h @ X.T + (1.0 if inner.bias else 0.0))
        z = z - scores @ delta
        if inner.bias:
            z = z + sum(c[:, None] * tree[bias][None] for tree, c in starts)
        h = jax.nn.gelu(z, approximate=True) if layer < L else z
    o = read(inner, q, _layer_norm(h, ln) if inner.norm else h)
    if here is not None:
        o = jnp.where(here[:, None], o, 0.0)

    def grads(w):  # sum_j w_j grad_j, as a params dict
        out = {}
        for layer in range(1, L + 1):
            X, delta = xs[layer - 1], deltas[layer - 1]
            out[f"W{layer}"] = X.T @ (w[:, None] * delta)
            if inner.bias:
                out[f"b{layer}"] = w @ delta
        return out

    neg = lambda tree: jax.tree.map(jnp.negative, tree)  # noqa: E731
    S = None if log_eta is None else _combine((cf["P_end"], -1.0), (S0, grads(cf["Etheta_end"])))
    U0_or_none = None if fresh else U0
    if close:
        R = _combine(((cf["A"] if fresh else A0 * cf["A"])[-1], cf["tokA"][-1],
                      None if S0 is None else cf["tokm"][-1], 1.0), (M0, U0_or_none, S0, neg(grads(cf["K"][-1]))))
        return (R, jax.tree.map(jnp.zeros_like, R), jnp.ones(()), S), o
    U = _combine((cf["A"][-1], None if S0 is None else cf["m_end"], 1.0), (U0_or_none, S0, neg(grads(cf["C_end"]))))
    return (M0, U, (1.0 if fresh else A0) * cf["A"][-1], S), o


def parallel(q, k, v, *, inner: Inner, theta, log_a=None, log_eta=None, tok=None, ln=None, state=None,
             initial: dict | None = None, mini_batch: int | None, start: int = 0, read_at=None, saved: str = "all"):
    """The training form, equal to `recurrent`: mini-batch by mini-batch, no per-token weights built.

    From `initial` (state None) the first mini-batch reads the one initial model of every example (one matmul
    for the batch, its gradient summed in it) and no momentum, which is zero there. read_at [B, Q]: o only at
    those positions, [B, Q, H, d], each block reading the Q queries (a read is a third of a block's work).
    saved: what each block keeps for the backward pass (`SAVED`)."""
    B, T, H, d = q.shape
    b = mini_batch or T
    # a call that begins a mini-batch begins it fresh: after a close, or from the initial state, U = 0 and A = 1
    fresh = state is None or start == 0 or (mini_batch is not None and start % mini_batch == 0)
    # where in its mini-batch the call begins (one endless mini-batch: the carried U, A hold what came before)
    start = start % mini_batch if mini_batch else 0
    n = -(-(start + T) // b)
    pad = (start, n * b - start - T)
    zeros = jnp.zeros((B, T, H))
    log_a = zeros if log_a is None else log_a
    tok = jnp.ones((b,)) if tok is None else tok
    ln = (jnp.ones((H, d)), jnp.zeros((H, d))) if ln is None else ln
    live = jnp.ones((B, T, H))

    def blocks(x):  # [B, T, H, ...] -> [n, B, H, b, ...]; padded tokens are zeros: no rate, no decay, no momentum
        x = jnp.pad(x, [(0, 0), pad] + [(0, 0)] * (x.ndim - 2))
        return jnp.moveaxis(x.reshape(B, n, b, H, *x.shape[3:]), (1, 3), (0, 2))

    xs = tuple(None if x is None else blocks(x) for x in (k, v, theta, log_a, log_eta, live))
    if read_at is None:
        xs = (blocks(q), *xs, None, None)
    else:  # every block gets the Q queries [n, B, H, Q, d], their places [n, B, Q] and whether each is its own
        place = read_at + start  # in the padded sequence
        q_read = jnp.moveaxis(at_positions(q, read_at), 1, 2)
        own = (place // b)[None] == jnp.arange(n)[:, None, None]
        xs = (jnp.broadcast_to(q_read, (n, *q_read.shape)), *xs, jnp.broadcast_to(place % b, own.shape), own)

    def head_block(carry, x, ln_h, close, fresh):
        return _block(inner, carry, (*x, tok), ln_h, close, fresh)

    def step(close, fresh, shared=False):  # shared: the carry is the initial model's, one for the batch
        x_axes = (0,) * 7 + (None, None)  # q, k, v, theta, log_a, log_eta, live; rows and here, every head's
        heads = jax.vmap(partial(head_block, close=close, fresh=fresh), in_axes=((0, 0, 0, 0), x_axes, 0))
        batch = jax.vmap(heads, in_axes=((None if shared else 0, 0, 0, 0), (0,) * 9, None))
        return batch if SAVED[saved] is None else jax.checkpoint(batch, policy=SAVED[saved])

    carry, outs = ((initial, None, None, None) if state is None else tuple(state)), []
    block = lambda i: jax.tree.map(lambda x: x[i], xs)  # noqa: E731
    whole = mini_batch is not None and (start + T) % b == 0  # the last mini-batch is whole: it closes
    # every block but the last closes, and every block after the first starts fresh
    if n <= UNROLLED:  # each block its own code
        for i in range(n - 1):
            carry, o = step(True, fresh or i > 0, state is None and i == 0)(carry, block(i), ln)
            outs.append(o[None])
    else:  # the first block, then a scan over all but the last
        carry, o = step(True, fresh, state is None)(carry, block(0), ln)
        outs.append(o[None])
        body = step(True, True)
        carry, o = jax.lax.scan(lambda c, x: body(c, x, ln), carry, jax.tree.map(lambda x: x[1:-1], xs))
        outs.append(o)
    carry, o = step(whole, fresh or n > 1, state is None and n == 1)(carry, block(-1), ln)
    outs.append(o[None])
    o = jnp.concatenate(outs, axis=0)  # [n, B, H, b or Q, d]
    if read_at is not None:  # each read is its own block's, zero in every other
        return jnp.moveaxis(o.sum(0), 1, 2), carry
    o = jnp.moveaxis(o, (0, 2), (1, 3)).reshape(B, n * b, H, d)[:, start:start + T]
    return o, carry
