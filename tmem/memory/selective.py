"""Mamba's selective state space (Mamba-1, Gu and Dao 2023): a decay for every entry of the state.

Per example, d channels each keep N states, S [d, N], written and read

    S_t = exp(dt_t 1^T * A) * S_{t-1} + (dt_t * x_t) B_t^T,    y_t = S_t C_t

(* elementwise; the layer adds D * x_t). A [d, N] < 0 is a parameter, dt_t [d],
B_t and C_t [N] come from the token. In the note's terms the state is a memory
whose keys are B_t, values dt_t * x_t and queries C_t, as Mamba-2's, but its
decay exp(dt_t[c] A[c, n]) differs per (channel, state) entry rather than per
head: no C x C decay matrix serves a chunk, so the fast-weight rows' chunked
form (tmem.memory.chunked) does not apply. Two forms here instead:

* `scan`, the definition: one token at a time (lax.scan), the state alone kept,
  which the layer trains in (faster on a CPU: docs/rows.md);
* `parallel`: the recurrence is the linear map h -> a h + u, and
  composing two of them is associative, (a1, u1) then (a2, u2) = (a1 a2, a2 u1 + u2),
  so `jax.lax.associative_scan` computes every S_t in log2(T) rounds, each
  elementwise over [B, T, d, N] (Blelloch's scan; recurrentgemma's option for
  its diagonal recurrence). It holds every S_t, T d N numbers an example.

Shapes: x, dt [B, T, d]; A [d, N]; Bm, Cm [B, T, N]; state None or [B, d, N];
read_at None or [B, Q]. The math runs in float32.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp


def _prepare(x, dt, Bm, Cm, state):
    f32 = lambda y: jnp.asarray(y, jnp.float32)  # noqa: E731
    Bt, _, d = x.shape
    state = jnp.zeros((Bt, d, Bm.shape[-1]), jnp.float32) if state is None else f32(state)
    return f32(x), f32(dt), f32(Bm), f32(Cm), state


def scan(x, dt, A, Bm, Cm, *, state=None, read_at=None, precision=None):
    """The definition, a token at a time: y [B, T or Q, d] and the final state [B, d, N]."""
    out_dtype = x.dtype
    x, dt, Bm, Cm, state = _prepare(x, dt, Bm, Cm, state)
    einsum = partial(jnp.einsum, precision=precision)

    def step(S, inputs):
        x_t, dt_t, B_t, C_t = inputs  # [B, d], [B, d], [B, N], [B, N]
        S = jnp.exp(dt_t[..., None] * A[None]) * S + (dt_t * x_t)[..., None] * B_t[:, None, :]
        return S, einsum("bdn,bn->bd", S, C_t)

    time_major = lambda y: jnp.moveaxis(y, 1, 0)  # noqa: E731
    final, y = jax.lax.scan(step, state, tuple(map(time_major, (x, dt, Bm, Cm))))
    return _at(time_major(y), read_at).astype(out_dtype), final


def _compose(earlier, later):
    """Two steps h -> a h + u as one: first `earlier`, then `later`."""
    a1, u1 = earlier
    a2, u2 = later
    return a1 * a2, a2 * u1 + u2


def parallel(x, dt, A, Bm, Cm, *, state=None, read_at=None, precision=None):
    """The same as `scan`, every S_t at once by an associative scan over the tokens; read only at read_at."""
    out_dtype, empty = x.dtype, state is None
    x, dt, Bm, Cm, state = _prepare(x, dt, Bm, Cm, state)
    a = jnp.exp(dt[..., None] * A[None, None])  # [B, T, d, N]
    u = (dt * x)[..., None] * Bm[:, :, None, :]
    if not empty:  # the state entering folds into the first token's write
        u = u.at[:, 0].add(a[:, 0] * state)
    _, S = jax.lax.associative_scan(_compose, (a, u), axis=1)
    y = jnp.einsum("btdn,btn->btd", _at(S, read_at), _at(Cm, read_at), precision=precision)
    return y.astype(out_dtype), S[:, -1]


def _at(y, read_at):
    """y [B, T, ...] at positions read_at [B, Q] (all of y when None)."""
    if read_at is None:
        return y
    return jnp.take_along_axis(y, read_at.reshape(read_at.shape + (1,) * (y.ndim - 2)), axis=1)


FORMS = {"parallel": parallel, "scan": scan}
