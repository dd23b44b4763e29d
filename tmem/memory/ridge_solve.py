"""The ridge systems of mesa's parallel form, (H_r + Lambda) x_r = q_r, solved side by side and differentiated
with the sums' structure (tmem.memory.mesa).

Each system's matrix is a weighted sum of the keys' outer products, plus a
decayed state where one enters:

    H_r = sum_j W_rj k_j k_j^T + e_r S,

W the gated decays (a chunk's C x C, or each read's row over the sequence).
The solve's gradient is dq = g and dH_r = -g_r x_r^T with g_r = (H_r + Lambda)^{-1} dx_r
(the same matrix: it is symmetric). Autodiff would push that rank-one dH_r
through the sums as a d_k x d_k matrix per read, and copy it into the
layout of the sums' matmul: most of the step. Contracted with the keys first, it
needs only C x C scores,

    dW_rj = -(x_r . k_j)(g_r . k_j),    dk_j = -sum_r W_rj [g_r (x_r . k_j) + x_r (g_r . k_j)],
    dLambda = -sum_r g_r * x_r,         dS = -sum_r e_r g_r x_r^T,    de_r = -g_r^T S x_r,

and Lambda is never added to a matrix: the conjugate gradient's product is
H p + Lambda p. The solvers: `cg`, a fixed number of conjugate-gradient steps
from the Jacobi guess (MesaNet's), its backward the same steps on dx; and
`cholesky`, exact, a batched factorisation kept for the backward.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular

SOLVERS = ("cg", "cholesky")


def _safe_div(num, den):
    ok = den > 0
    return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)


def cg(operator, op, b, steps: int, precision=None):
    """`steps` conjugate-gradient iterations on A x = b, A symmetric positive definite given as `operator` (its
    product and its diagonal, and for tmem.memory.mesa's chunked form the pullback of its product) of `op`,
    started at the Jacobi guess b / diag(A). Each row of b is its own system. A converged residual stays put:
    zero steps, not 0 / 0."""
    apply, diagonal = operator[:2]
    dot = lambda x, y: jnp.sum(x * y, axis=-1, keepdims=True)  # noqa: E731
    x = b / diagonal(op, precision)
    r = b - apply(op, x, precision)
    p, rr = r, dot(r, r)

    def step(carry, _):
        x, r, p, rr = carry
        Ap = apply(op, p, precision)
        alpha = _safe_div(rr, dot(p, Ap))
        x, r = x + alpha * p, r - alpha * Ap
        rr_new = dot(r, r)
        p = r + _safe_div(rr_new, rr) * p
        return (x, r, p, rr_new), None

    return jax.lax.scan(step, (x, r, p, rr), None, length=steps)[0][0]


def _ridge_apply(op, p, precision):
    """(H + Lambda) p, H [..., d, d] given whole and Lambda broadcasting against p: no H + Lambda is made."""
    H, lam = op
    return jnp.einsum("...kl,...l->...k", H, p, precision=precision) + lam * p


def _ridge_diagonal(op, precision):
    H, lam = op
    return jnp.diagonal(H, axis1=-2, axis2=-1) + lam


RIDGE = (_ridge_apply, _ridge_diagonal)


def _cholesky_apply(L, b):
    y = solve_triangular(L, b[..., None], lower=True)
    return solve_triangular(L, y, lower=True, trans="T")[..., 0]


def _factor(solver: str, H, lam, shape):
    """What each solve with these matrices reads: H itself (cg) or the Cholesky factor of H + Lambda."""
    if solver == "cg":
        return H
    eye = jnp.eye(shape[-1], dtype=H.dtype).reshape((1,) * (len(shape) - 1) + (shape[-1],) * 2)
    return jnp.linalg.cholesky(H + jnp.broadcast_to(lam, shape)[..., None] * eye)


def _solve(solver: str, factor, lam, b, steps: int, precision):
    if solver == "cg":
        return cg(RIDGE, (factor, lam), b, steps, precision)
    return _cholesky_apply(factor, b)


def sums(W, k, e=None, S=None, precision=None):
    """H_r = sum_j W_rj k_j k_j^T + e_r S [..., R, d, d]: W [..., R, J] times the outer products of k [..., J, d]
    (one matmul), and where a state enters, S [..., 1 or R, d, d] (shared by the reads or one each) times e [..., R]."""
    d = k.shape[-1]
    # the keys made once: XLA would otherwise fuse their making (the convolution, the unit norm) into the outer
    # products and redo it d_k times a key (a quarter of the evaluation's time)
    k = jax.lax.optimization_barrier(k)
    outer = (k[..., :, :, None] * k[..., :, None, :]).reshape(*k.shape[:-1], d * d)
    H = jnp.einsum("...rj,...jx->...rx", W, outer, precision=precision).reshape(*W.shape[:-1], d, d)
    return H if S is None else H + e[..., None, None] * S


@partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8))
def ridge_solve(W, k, q, lam, e, S, solver: str = "cg", steps: int = 30, precision=None):
    """x_r = (H_r + Lambda)^{-1} q_r [..., R, d] with H_r = `sums`(W, k, e, S), lam broadcasting against q; e and S
    None where no state enters. Differentiated as the exact solve (equal to it once CG has converged), with the
    sums' gradients contracted through the keys (the module's docstring): no d x d matrix per read backward."""
    return _ridge_fwd(W, k, q, lam, e, S, solver, steps, precision)[0]


def _ridge_fwd(W, k, q, lam, e, S, solver, steps, precision):
    factor = _factor(solver, sums(W, k, e, S, precision), lam, q.shape)
    x = _solve(solver, factor, lam, q, steps, precision)
    return x, (W, k, lam, e, S, factor, x)


def _sum_to(x, shape):
    """x summed to `shape`, which it was broadcast from: over its leading axes and where `shape` has 1."""
    x = jnp.sum(x, axis=tuple(range(x.ndim - len(shape))))
    return jnp.sum(x, axis=tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1), keepdims=True)


def _ridge_bwd(solver, steps, precision, residuals, dx):
    W, k, lam, e, S, factor, x = residuals
    einsum = partial(jnp.einsum, precision=precision)
    g = _solve(solver, factor, lam, dx, steps, precision)  # the adjoint system is the same: H + Lambda is symmetric
    xk, gk = einsum("...rd,...jd->...rj", x, k), einsum("...rd,...jd->...rj", g, k)
    dk = -(einsum("...rj,...rd->...jd", W * xk, g) + einsum("...rj,...rd->...jd", W * gk, x))
    grads = (-xk * gk, dk, g, _sum_to(-g * x, lam.shape))
    if S is None:
        return (*grads, None, None)
    if S.shape[-3] == 1:  # one state for all the reads: dS its sum over them, never a matrix per read
        Sx = einsum("...kl,...rl->...rk", S[..., 0, :, :], x)
        dS = -einsum("...r,...rk,...rl->...kl", e, g, x)[..., None, :, :]
    else:
        Sx = einsum("...rkl,...rl->...rk", S, x)
        dS = -einsum("...r,...rk,...rl->...rkl", e, g, x)
    return (*grads, -jnp.sum(g * Sx, axis=-1), dS)


ridge_solve.defvjp(_ridge_fwd, _ridge_bwd)
