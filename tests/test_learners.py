"""Reference learners: token dynamics against explicit GD, step-size fits, least squares."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tasks.linreg import LinReg
from tmem.probes import learners as L


def parts(n=4096, seed=0, **task):
    b = LinReg(**task).sample(jax.random.key(seed), n)
    x, y = b.meta["x"], b.meta["y"]
    return x[:, :-1], y[:, :-1], x[:, -1], y[:, -1]


def test_token_dynamics_are_explicit_gd_and_the_sensitivity_is_the_weight():
    X, Y, xq, _ = parts(n=8, dim=4, num_examples=7)
    etas = [0.9, 1.3, 0.6]
    f = lambda q: L.token_gd(X, Y, q, etas)  # noqa: E731
    W = jax.vmap(lambda X, Y: L.gd_weights(X, Y[:, None], etas)[0])(X, Y)
    np.testing.assert_allclose(f(xq), jnp.einsum("bd,bd->b", W, xq), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(L.sensitivity(f, xq), W, rtol=1e-5, atol=1e-6)


def test_gdpp_preconditions_every_token():
    X, Y, xq, _ = parts(n=8, dim=4, num_examples=7)
    eta, gamma = 1.1, 0.2
    got = L.token_gd(X, Y, xq, [eta, eta], [gamma, gamma])
    # by hand: step 1 moves labels with the old x, then every x (query too) by (I - gamma X^T X)
    N = X.shape[1]
    w1 = (eta / N) * jnp.einsum("bn,bnd->bd", Y, X)
    R = Y - jnp.einsum("bnd,bd->bn", X, w1)
    M = jnp.eye(4)[None] - gamma * jnp.einsum("bnd,bne->bde", X, X)
    X2, xq2 = jnp.einsum("bde,bne->bnd", M, X), jnp.einsum("bde,be->bd", M, xq)
    yq1 = -jnp.einsum("bd,bd->b", w1, xq)
    want = -(yq1 - (eta / N) * jnp.einsum("bn,bn->b", R, jnp.einsum("bnd,bd->bn", X2, xq2)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_closed_form_step_size_matches_the_search_and_the_published_loss():
    X, Y, xq, yq = parts(n=10000)
    eta = float(L.one_step_eta(X, Y, xq, yq))
    assert L.search_eta(X, Y, xq, yq, 1, 2 * eta) == pytest.approx(eta, rel=2e-3)
    assert eta == pytest.approx(6.0, rel=0.05)  # von Oswald's fit at d = N = 10, x ~ U(-1/2, 1/2)
    loss = float(L.half_mse(L.token_gd(X, Y, xq, [eta]), yq))
    assert loss == pytest.approx(0.207, rel=0.05)
    for e in (0.9 * eta, 1.1 * eta):
        assert float(L.half_mse(L.token_gd(X, Y, xq, [e]), yq)) > loss


@pytest.mark.slow  # 3 s: a fit of GD++'s gamma
def test_gdpp_fit_beats_gd_and_finds_the_published_gamma():
    X, Y, xq, yq = parts(n=1024)
    eta = L.search_eta(X, Y, xq, yq, 2, 12.0)
    gd = float(L.half_mse(L.token_gd(X, Y, xq, [eta] * 2), yq))
    etas, gammas = L.fit_gdpp(X, Y, xq, yq, [eta] * 2, [0.0] * 2, per_layer=False)
    gdpp = float(L.half_mse(L.token_gd(X, Y, xq, etas, gammas), yq))
    assert gdpp < 0.8 * gd
    assert 0.15 < gammas[0] < 0.2  # von Oswald A.10: 0.179 for trained recurrent 2-layer models
    etas2, gammas2 = L.fit_gdpp_layers((X, Y, xq, yq), float(etas[0]), float(gammas[0]), 2)
    assert float(L.half_mse(L.token_gd(X, Y, xq, etas2, gammas2), yq)) < 0.85 * gdpp  # the better minimum


def test_least_squares_and_ridge():
    X, Y, xq, yq = parts(n=64, num_examples=12, dim=5)
    pred, w = L.ridge(X, Y, xq)
    np.testing.assert_allclose(pred, yq, rtol=1e-4, atol=1e-5)  # noiseless and N > d: exact
    lam = 0.5
    pred, w = L.ridge(X, Y, xq, lam)
    Xn, Yn = np.asarray(X[0], np.float64), np.asarray(Y[0], np.float64)
    np.testing.assert_allclose(w[0], np.linalg.solve(Xn.T @ Xn + lam * np.eye(5), Xn.T @ Yn), rtol=1e-10)
