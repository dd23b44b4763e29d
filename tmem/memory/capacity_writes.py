"""The written stores of the capacity table: delta, recursive least squares, decayed (Chapters 4, 10; D5).

These stores are made by writing the pairs one at a time with the write rules
of tmem.memory.stores, so, unlike the stores of capacity.py, whose state is a
function of the set of pairs, a pair's read can depend on its age (the number
of pairs written after it). capacity.py measures them as it measures the
others; this module holds what differs: the order of the writes, which keys
are queried, and the decayed store's theory.

* Order. Rows are written last first: row i of K and V is the pair of age i
  (row 0 the newest). The empty rows past M have zero keys and are written
  first, to the empty store, which every rule here leaves empty (a zero key
  writes nothing), so one compiled program serves every M <= N.
* Queries. Up to n_q pairs all are queried; above, one age drawn uniformly in
  each of n_q equal bands of [0, M), so every age is equally likely and the
  pool averages over the ages as the theory does. The newest (age 0) and the
  oldest (age M - 1) pairs are queried besides, and pooled apart: the ends.

The stores and their one knob:

* delta (beta = 1): S <- S + beta k (v - S^T k)^T, `delta_writes`. No closed
  form for the ratio is derived here (the note derives none: "only the last of
  these has a capacity derived here"), so its theory is None. Two exact facts
  it is checked against: the newest pair's signal weight is beta, and with
  beta = 1 its read is exact (ratio zero); and the mean signal weight of the
  pair of age a is beta (1 - beta/d)^a, since a later write maps the pair's
  key-side vector x to (I - beta k k^T) x with k a random unit key independent
  of x, and E[k_j . (I - beta k k^T) x] = (1 - beta/d) k_j . x (E[k k^T] = I/d).
  The erasures shrink an old pair's signal without cancelling the crosstalk
  it receives, so old pairs read worse than Hebbian's and so does the pool:
  at d = 64 it crosses one near M = 47 against Hebbian's 65 (beta = 1/2
  holds about 67), while the newest pairs read better. The signal weight
  can even cross zero (k^T P_2 P_1 k < 0 for two later keys close to k), so
  in exact terms E[1/w^2], and the pooled ratio, are infinite; at d = 64 near
  the capacity such weights are over five standard deviations away and seeds
  agree within 2%, but at d = 16 a store of d pairs meets them and estimates
  wander.
* rls (ridge = 1e-3): `rls_writes` from `rls_init(ridge)`. After M writes it is
  the ridge store (sum k k^T + ridge I)^-1 K^T V (D5), so its theory is least
  squares' (2d - 2; the note's 2d). The ridge is what float32 allows: each
  Sherman-Morrison step subtracts terms of size 1/ridge along unseen
  directions, losing about eps/ridge (at d = 16 its reads are within 2e-5 of
  the batch solve's, and 2e-2 with a ridge of 1e-6), while at the capacity
  (M = 2d) the keys' Gram matrix has its smallest eigenvalue near
  (sqrt(2) - 1)^2 = 0.17, so a ridge of 1e-3 moves the ratio by under 1%.
* decayed (gamma = 1 - 1/d): S <- gamma S + k v^T, `decayed_writes` (RetNet's
  row): the Hebbian store of keys scaled by gamma^age. Its exact-moment theory
  is below.

The decayed store's theory. Query the pair of age a: the read is
sum_b gamma^b (k_b . k_a) v_b, the signal gamma^a v_a and the interference
the rest. The values are independent unit vectors of mean zero, so the cross
terms vanish in expectation, and E[(k_b . k_a)^2] = 1/d (D1); the signal is
fixed, so with g = gamma^2, exactly,

    E[||interference||^2 / ||signal||^2] = (1/d) sum_{b != a} g^(b-a)
                                        = (1/d) (g^-a (1 - g^M) / (1 - g) - 1).

Averaged over the M ages (what the pool measures), with e = -ln g,

    ratio^2 = (1/d) (mean_a g^-a * sum_b g^b - 1) = (1/d) (sinh^2(M e/2) / (M sinh^2(e/2)) - 1),

which is Hebbian's (M - 1)/d at gamma = 1 and, as the mean of g^-a times the
mean of g^a is at least one, never below it: decay never raises the pooled
capacity, the root of ratio = 1, which lies in [1, d + 1]. As M grows the
pooled ratio grows without bound (the oldest pairs' signal gamma^a vanishes:
they drown), so the capacity is always finite and the search ends. But a
store that decays never fills: in an endless stream the pair of age a has
ratio^2 (1/d) (g^-a / (1 - g) - 1), below one for every age under the
horizon H = ln((d + 1)(1 - g)) / ln(1/g). H > 0 needs g < d/(d + 1) (a decay
fast enough for the width; Hebbian's H is 0), and H is largest, about
(d + 1)/e, at 1 - g = e/(d + 1). The default gamma = 1 - 1/d (1 - g about
2/d, a memory of about d/2 pairs) keeps H within 6% of that largest value.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from tmem.memory.stores import decayed_writes, delta_writes, rls_init, rls_writes

# store -> (the name of its knob, its default; None: 1 - 1/d_k)
WRITTEN: dict[str, tuple[str, float | None]] = {"delta": ("beta", 1.0), "rls": ("ridge", 1e-3),
                                                "decayed": ("gamma", None)}


def default_knob(store: str, d_k: int) -> float:
    """The written store's knob when none is given: beta = 1, ridge = 1e-3, gamma = 1 - 1/d_k."""
    value = WRITTEN[store][1]
    return 1.0 - 1.0 / d_k if value is None else value


def check_knob(store: str, knob: float) -> None:
    """Refuse a knob outside the range where the store is what its name says, in one line."""
    ok = {"delta": 0 < knob < 2, "rls": knob > 0, "decayed": 0 < knob <= 1}[store]
    if not ok:
        allowed = {"delta": "0 < beta < 2 (the erase I - beta k k^T shrinks)", "rls": "ridge > 0",
                   "decayed": "0 < gamma <= 1"}[store]
        raise ValueError(f"{store}: {WRITTEN[store][0]}={knob} is outside {allowed}")


def write_store(store: str, K: jax.Array, V: jax.Array, knob) -> jax.Array:
    """The state S [d_k, d_v] after writing the rows of K [N, d_k] and V [N, d_v] last first (row 0 newest)."""
    K, V = K[::-1], V[::-1]
    d_k, d_v = K.shape[1], V.shape[1]
    if store == "delta":
        return delta_writes(jnp.zeros((d_k, d_v), V.dtype), K, V, knob)
    if store == "rls":
        return rls_writes(rls_init(d_k, d_v, knob, V.dtype), K, V)[0]
    if store == "decayed":
        return decayed_writes(jnp.zeros((d_k, d_v), V.dtype), K, V, knob)
    raise ValueError(f"not a written store: {store}")


def query_rows(M, n_q: int, offsets: jax.Array | None = None) -> jax.Array:
    """The rows (ages) queried in a store of M pairs, then the newest and the oldest: [n_q + 2].

    All the first n_q rows when M <= n_q (those past M are empty and not pooled);
    else one in each of n_q equal bands of [0, M), at offsets [n_q] in [0, 1)
    (None: each band's middle).
    """
    j = jnp.arange(n_q)
    offsets = 0.5 if offsets is None else offsets
    spread = jnp.minimum(jnp.floor((j + offsets) * M / n_q).astype(j.dtype), M - 1)
    return jnp.concatenate([jnp.where(M <= n_q, j, spread), jnp.array([0, M - 1], j.dtype)])


# -- the decayed store's theory ------------------------------------------------


def _decay_rate(gamma: float) -> float:
    """e = -ln gamma^2, the per-write rate at which a pair's squared signal fades."""
    return -2.0 * math.log(gamma)


def decayed_ratio(d: int, M, gamma: float):
    """The exact-moment ratio pooled over the ages of M pairs: sqrt((sinh^2(M e/2) / (M sinh^2(e/2)) - 1) / d)."""
    M = np.asarray(M, np.float64)
    e = _decay_rate(gamma)
    # (past sinh(350)^2, about 1e303, the ratio is infinite for every purpose; the cap keeps it finite)
    weights = M if e == 0 else np.sinh(np.minimum(M * e / 2, 350.0)) ** 2 / (M * math.sinh(e / 2) ** 2)
    return np.sqrt(np.clip((weights - 1) / d, 0, None))


def decayed_age_ratio(d: int, M, gamma: float, age):
    """The exact-moment ratio of the pair of age `age` among M: sqrt((g^-a (1 - g^M) / (1 - g) - 1) / d)."""
    e, M, age = _decay_rate(gamma), np.asarray(M, np.float64), np.asarray(age, np.float64)
    written = M if e == 0 else -np.expm1(-e * M) / -math.expm1(-e)  # sum_b g^b
    return np.sqrt(np.clip((np.exp(np.minimum(e * age, 700.0)) * written - 1) / d, 0, None))


def decayed_capacity(d: int, gamma: float) -> float:
    """The M in [1, d + 1] where the pooled ratio is one (d + 1 at gamma = 1, Hebbian's)."""
    from scipy.optimize import brentq

    if _decay_rate(gamma) == 0:
        return d + 1.0
    return float(brentq(lambda M: decayed_ratio(d, M, gamma) - 1.0, 1.0, d + 1.0, xtol=1e-9))


def decayed_horizon(d: int, gamma: float) -> float:
    """H = ln((d + 1)(1 - g)) / ln(1/g): in an endless stream the pairs younger than H read with ratio below one."""
    e = _decay_rate(gamma)
    if e == 0:
        return 0.0
    return max(0.0, math.log((d + 1) * -math.expm1(-e)) / e)
