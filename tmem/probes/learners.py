"""Reference learners for in-context linear regression, run on the same prompts as a model.

Every learner maps a batch of prompts (contexts X [B, N, d], labels Y [B, N],
query x_q [B, d]) to a prediction of y_q. All are linear in x_q, so the
gradient of a prediction with respect to x_q is the weight vector the learner
implies (`sensitivity`).

* GD: K steps on L(w) = 1/(2N) sum_i (w.x_i - y_i)^2 from w_0 = 0 with step eta.
* GD++ (von Oswald et al. §3): each step also moves every x (query included)
  to (I - gamma X X^T) x, a truncated-Neumann preconditioner of X X^T. Both are
  written as the token dynamics the LSA construction computes (`token_gd`).
* Least squares (min-norm, float64) and ridge at the Bayes-optimal lambda.

Step sizes are fitted on a set of tasks disjoint from the evaluation set:
one GD step in closed form, several by a grid search, GD++ by least squares
on (eta, gamma) from the plain-GD solution.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np


def half_mse(pred: jax.Array, target: jax.Array) -> jax.Array:
    return 0.5 * jnp.mean(jnp.square(pred - target))


def gd_weights(X_nd, Y_no, etas, w0_od=None):
    """Explicit GD on the weights of one task: W_k+1 = W_k - (eta_k/N) sum_i (W_k x_i - y_i) x_i^T.

    The oracle the LSA construction is tested against: [o, d] after len(etas) steps.
    """
    N = X_nd.shape[0]
    W = jnp.zeros((Y_no.shape[1], X_nd.shape[1])) if w0_od is None else jnp.asarray(w0_od)
    for eta in etas:
        W = W - (eta / N) * (X_nd @ W.T - Y_no).T @ X_nd
    return W


def token_gd(X, Y, xq, etas, gammas=None):
    """GD (gammas 0) or GD++ as von Oswald's token dynamics: the prediction [B].

    Tokens hold (x_j, y_j), the query (x_q, 0). Step l maps, from the values
    before the step, y_j -> y_j - (eta_l/N) sum_i y_i <x_i, x_j> and
    x_j -> x_j - gamma_l sum_i x_i <x_i, x_j>; the contexts' y-slots become the
    residuals y_i - w_l.x_i and the query's -w_l.x_q, so the prediction is
    minus the query's y-slot. Computed in the store form (the sums over i
    first, as the LSA layer's state), which is also the fast one.
    """
    N = X.shape[1]
    x = jnp.concatenate([X, xq[:, None]], 1)  # [B, N+1, d]
    y = jnp.concatenate([Y, jnp.zeros_like(Y[:, :1])], 1)  # [B, N+1]
    for l in range(len(etas)):
        s = (x[:, :N] * y[:, :N, None]).sum(1)  # sum_i y_i x_i  [B, d]
        y_new = y - (etas[l] / N) * (x * s[:, None, :]).sum(-1)
        if gammas is not None:
            M = (x[:, :N, :, None] * x[:, :N, None, :]).sum(1)  # sum_i x_i x_i^T  [B, d, d]
            x = x - gammas[l] * (x[:, :, None, :] * M[:, None]).sum(-1)
        y = y_new
    return -y[:, -1]


def sensitivity(predict, xq):
    """d prediction / d x_q per task [B, d]; tasks are independent, so the gradient of the sum."""
    return jax.grad(lambda q: predict(q).sum())(xq)


def one_step_eta(X, Y, xq, yq) -> jax.Array:
    """The best single-step eta in closed form: the loss is quadratic in eta.

    With g = (1/N) sum_i y_i <x_i, x_q> the prediction is eta g, so
    eta* = E[g y_q] / E[g^2].
    """
    g = jnp.einsum("bi,bi->b", Y, jnp.einsum("bid,bd->bi", X, xq)) / X.shape[1]
    return jnp.sum(g * yq) / jnp.sum(g * g)


def search_eta(X, Y, xq, yq, steps: int, eta_max: float, num: int = 101) -> float:
    """The eta of `steps` shared-step GD with the lowest loss: a grid on [0, eta_max], refined once.

    For one step use `one_step_eta`; this search is its check and the fit for more.
    """
    grid = jnp.linspace(0.0, eta_max, num)
    best = int(jnp.argmin(_grid_losses(X, Y, xq, yq, grid, steps)))
    h = eta_max / (num - 1)
    fine = jnp.linspace(max(best - 1, 0) * h, (best + 1) * h, num)
    return float(fine[int(jnp.argmin(_grid_losses(X, Y, xq, yq, fine, steps)))])


@partial(jax.jit, static_argnums=5)
def _grid_losses(X, Y, xq, yq, grid, steps: int):
    loss = lambda eta: half_mse(token_gd(X, Y, xq, [eta] * steps), yq)  # noqa: E731
    return jnp.nan_to_num(jax.lax.map(loss, grid), nan=jnp.inf)


def fit_gdpp(X, Y, xq, yq, etas, gammas, *, per_layer: bool, iterations: int = 30):
    """GD++ step sizes that minimise the fit loss, from (etas, gammas): one (eta, gamma) shared
    by every step, or with per_layer one pair per step.

    Levenberg-Marquardt on the residuals (prediction - y_q): a handful of
    parameters and a least-squares loss, so it converges in tens of iterations
    where Adam needs hundreds. Parameters are in units of the starting eta and
    of 1/(N E||x||^2) for gamma. Start the per-layer fit from the shared one:
    it is poorly conditioned for K >= 3 (von Oswald A.10).
    """
    etas, gammas = jnp.asarray(etas, jnp.float32), jnp.asarray(gammas, jnp.float32)
    units = (jnp.maximum(jnp.abs(etas).mean(), 1e-6), 1.0 / (X.shape[1] * jnp.mean(jnp.sum(X * X, -1))))
    p0 = jnp.concatenate([etas / units[0], gammas / units[1]])
    if not per_layer:
        p0 = p0[jnp.array([0, etas.shape[0]])]
    p = _levenberg_marquardt((X, Y, xq, yq), p0, units, etas.shape[0], iterations)
    return tuple(np.asarray(a) for a in _unpack(p, units, etas.shape[0]))


def fit_gdpp_layers(fit, eta: float, gamma: float, steps: int, validation=None):
    """Per-layer GD++ from the shared fit (eta, gamma): the best of a few starts.

    fit and validation are (X, Y, x_q, y_q). The per-layer loss has several
    minima: at d = N = 10 with two steps the shared start ends near eta =
    (21, 11) at loss 0.101, while a start that preconditions more first and
    steps further last (eta growing from 0.3 eta to 3 eta, gamma doubled) ends
    near eta = (4, 37), gamma_1 = 0.41 at 0.090. Long last steps sit close to
    divergence on the tasks with the largest X^T X, so at small d the better fit
    can generalise worse; the starts are compared on the validation tasks when
    given. The last step's gamma never reaches the prediction and stays as it starts.
    """
    ramp = np.geomspace(0.3, 3.0, steps) if steps > 1 else np.ones(1)
    starts = [([eta] * steps, [gamma] * steps), (list(eta * ramp), [2 * gamma] * steps)]
    fits = [fit_gdpp(*fit, e, g, per_layer=True) for e, g in starts]
    X, Y, xq, yq = fit if validation is None else validation
    losses = [float(half_mse(token_gd(X, Y, xq, e, g), yq)) for e, g in fits]
    return fits[int(np.nanargmin(losses))]


def _unpack(p, units, steps: int):
    """Normalised parameters -> (etas, gammas) of every step; two parameters mean shared ones."""
    if p.shape[0] == 2:
        p = jnp.repeat(p, steps)
    return p[:steps] * units[0], p[steps:] * units[1]


@partial(jax.jit, static_argnums=(3, 4))
def _levenberg_marquardt(data, p, units, steps: int, iterations: int):
    """Minimise ||prediction - y_q||^2 over p: damped Gauss-Newton steps, the damping adapted per step."""
    X, Y, xq, yq = data

    def residual(p):
        return token_gd(X, Y, xq, *_unpack(p, units, steps)) - yq

    def cost(p):
        return jnp.nan_to_num(jnp.sum(jnp.square(residual(p))), nan=jnp.inf)

    def step(carry, _):
        p, mu, c = carry
        r, J = residual(p), jax.jacfwd(residual)(p)  # [B], [B, P]
        JtJ = J.T @ J
        delta = jnp.linalg.solve(JtJ + mu * jnp.diag(jnp.diag(JtJ) + 1e-12), -J.T @ r)
        c_new = cost(p + delta)
        better = c_new < c
        return (jnp.where(better, p + delta, p), jnp.where(better, mu / 3, mu * 4), jnp.minimum(c, c_new)), None

    (p, _, _), _ = jax.lax.scan(step, (p, jnp.asarray(1e-2, p.dtype), cost(p)), None, length=iterations)
    return p


def ridge(X, Y, xq, lam: float = 0.0):
    """argmin_w sum_i (w.x_i - y_i)^2 + lam ||w||^2 in float64: (prediction [B], w [B, d]).

    lam = 0 is the min-norm least-squares solution (a pseudo-inverse: with
    N = d the Gram matrix is nearly singular, condition numbers near 1e3).
    """
    X, Y, xq = (np.asarray(a, np.float64) for a in (X, Y, xq))
    if lam > 0:
        d = X.shape[-1]
        gram = np.einsum("bnd,bne->bde", X, X) + lam * np.eye(d)
        w = np.linalg.solve(gram, np.einsum("bnd,bn->bd", X, Y)[..., None])[..., 0]
    else:
        w = np.einsum("bdn,bn->bd", np.linalg.pinv(X), Y)
    return np.einsum("bd,bd->b", w, xq), w
