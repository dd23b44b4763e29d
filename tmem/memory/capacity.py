"""How many random pairs a store holds: interference against signal (Chapters 3 to 6).

Store M pairs of random unit keys and values, query with a stored key, and
split the read-out into the signal (the queried value, with the weight the
read gives it) and the interference (everything else). The capacity is the
M at which the interference-to-signal ratio, as a root mean square over
draws of stores and queries, sqrt(E[||interference||^2 / ||signal||^2]),
reaches one: the note's convention.

Measurement uses the stores' own write and read functions; the theory is the
note's formula and its exact-moment form for unit vectors: with s = k . q of
two random unit vectors in R^d and a read sum_i sigma(s_i) v_i,
ratio^2 = (M - 1) E[sigma(s)^2] / sigma(1)^2, so M = 1 + sigma(1)^2 / E[sigma(s)^2].

The written stores (delta, rls, decayed) are made by writing the pairs in
order, so a pair's read depends on its age; capacity_writes.py holds their
order, their queries and the decayed store's theory. Each store has at most
one knob, passed as `knob` (None: its default): softmax's inverse temperature
beta, the delta rule's write strength beta, the RLS ridge, the decay gamma,
the random-feature store's number of features m.

The random-feature store (Chapter 12) is a matrix store of Performer's
features, S = sum_i phi(k_i) v_i^T read phi(q)^T S, whose kernel estimates the
exponential read's exp(beta k.q) at beta = sqrt(d_k) (the softmax entry's);
each store draws its own features. It has no theory here: its capacity lies
between the linear store's and the exponential read's as m grows.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from tmem.memory.capacity_writes import (WRITTEN, check_knob, decayed_capacity, decayed_ratio, query_rows,
                                         write_store)
from tmem.memory.capacity_writes import default_knob as written_knob
from tmem.memory.features import performer, random_features
from tmem.memory.reads import SCORES, exp_read, linear_read, score_read
from tmem.memory.stores import hebbian_write, lstsq_write

# store name -> score function of its read (None: a matrix store with the linear read)
STORES: dict[str, str | None] = {
    "hebbian": None, "lstsq": None, "relu": "relu", "relu2": "relu2", "relu3": "relu3",
    "softmax": None, "gelu": "gelu", "swiglu": "swish_gate", "delta": None, "rls": None, "decayed": None,
    "performer": None,
}
# store name -> the name of its knob (the others have none)
KNOBS: dict[str, str] = {"softmax": "beta", "performer": "features",
                         **{store: name for store, (name, _) in WRITTEN.items()}}
# the random-feature store draws this many features and keeps the first m (its knob), so one compiled program
# serves every m: the knob is an argument of the program, not a shape
MAX_FEATURES = 1024


def default_knob(store: str, d_k: int) -> float:
    """The knob a store gets when none is given: softmax's beta = 1, the written stores' defaults, 64 features."""
    if store == "performer":
        return 64
    return written_knob(store, d_k) if store in WRITTEN else 1.0


def random_feature_read(K: jax.Array, V: jax.Array, queries: jax.Array, m, key: jax.Array) -> jax.Array:
    """phi(q)^T sum_i phi(k_i) v_i^T with the first m of MAX_FEATURES Performer features drawn from `key`.

    performer() estimates exp(x.y / sqrt(d)); keys scaled by sqrt(d) make that exp(sqrt(d) k.q), the exponential
    read at beta = sqrt(d). The features' common scale 1/sqrt(m) cancels in any ratio, so it is left out.
    """
    d = K.shape[1]
    keep = (jnp.arange(MAX_FEATURES) < m)[None, :]
    w = random_features(key, d, MAX_FEATURES)
    phi = lambda x: performer(math.sqrt(d) * x, w) * keep  # noqa: E731
    return linear_read(hebbian_write(phi(K), V), phi(queries))


def recall(store: str, K: jax.Array, V: jax.Array, queries: jax.Array, knob=None, key=None) -> jax.Array:
    """Read-out [Q, d_v] of `store` holding the pairs (K, V) for queries [Q, d_k], with its knob (None: the default).

    A written store writes the rows last first: row 0 is the newest pair. `key` draws the random-feature
    store's features.
    """
    knob = default_knob(store, K.shape[1]) if knob is None else knob
    if store == "performer":
        return random_feature_read(K, V, queries, knob, key)
    if store in WRITTEN:
        return linear_read(write_store(store, K, V, knob), queries)
    if store == "hebbian":
        return linear_read(hebbian_write(K, V), queries)
    if store == "lstsq":
        # A zero key is no memory at all for this store, so padded rows are zeroed keys;
        # the tiny ridge only keeps the padded (K^T K) solvable below M = d_k.
        return linear_read(lstsq_write(K, V, ridge=1e-6), queries)
    if store == "softmax":
        return exp_read(K, V, queries, knob)[0]
    return score_read(K, V, queries, STORES[store])


def _unit(x: jax.Array) -> jax.Array:
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def split_recall(store: str, K: jax.Array, V: jax.Array, M, n_queries: int, knob=None, offsets=None, key=None):
    """The sum over the stored keys queried of ||interference||^2 / ||signal||^2, and their number,
    for one random store: M pairs of unit keys and values, the directions of K [N, d_k] and V [N, d_v].

    Rows M.. of the N drawn hold zero values (and zero keys for least squares and
    the written stores), which every read here ignores up to a normaliser common
    to all terms of one read (so taking the ratio per query cancels it); so one
    compiled program serves every M <= N. The first min(M, n_queries) keys are
    the queries, or for a written store the rows `query_rows` picks with
    `offsets` [n_queries].
    """
    ratio2, pooled = query_ratios(store, K, V, M, n_queries, knob, offsets, key)
    return jnp.sum(jnp.where(pooled, ratio2, 0.0)), jnp.sum(pooled)


def query_ratios(store: str, K: jax.Array, V: jax.Array, M, n_queries: int, knob=None, offsets=None, key=None):
    """Each query's ||interference||^2 / ||signal||^2 and whether it joins the pool (split_recall's parts).

    A written store's queries end with its newest and oldest pairs, outside the pool.
    Every read is linear in the values, so the weight w_jj that the read of
    key j gives its own value is read out through extra value columns, one per
    queried memory j, holding 1 at row j and 0 elsewhere.
    """
    N = K.shape[0]
    present = (jnp.arange(N) < M)[:, None]
    K, V = _unit(K), jnp.where(present, _unit(V), 0.0)
    if store == "lstsq" or store in WRITTEN:
        K = jnp.where(present, K, 0.0)
    rows = query_rows(M, n_queries, offsets) if store in WRITTEN else jnp.arange(n_queries)
    marks = (jnp.arange(N)[:, None] == rows[None, :]).astype(V.dtype)
    out = recall(store, K, jnp.concatenate([V, marks], axis=1), K[rows], knob, key)
    d_v = V.shape[1]
    signal = jnp.diagonal(out[:, d_v:])[:, None] * V[rows]
    ratio2 = jnp.sum((out[:, :d_v] - signal) ** 2, -1) / jnp.maximum(jnp.sum(signal**2, -1), 1e-30)
    return ratio2, jnp.arange(rows.shape[0]) < jnp.minimum(M, n_queries)


def interference_ratio(store: str, key: jax.Array, M: int, d_k: int, d_v: int | None = None, *,
                       queries: int = 512, per_store: int = 64, knob: float | None = None,
                       max_elements: int = 2**25) -> float:
    """The ratio at M, pooled over at least `queries` queries of independent random stores.

    Stores are drawn with N = store_rows(M) rows, a batch of them per call of
    one jitted program per (store, N, widths), with the knob an argument rather
    than a constant; a batch's score matrices stay under max_elements floats,
    and calls repeat until enough queries are pooled. The draws use XLA's own
    generator (the rbg key), whose programs compile several times faster than
    threefry's on CPU; compiling, not running, dominates below a few thousand pairs.
    """
    program, n_q, batch = _program(store, M, d_k, d_v, queries, per_store, max_elements)
    total, count, _, _ = _draw(program, store, key, M, d_k, knob, math.ceil(queries / (batch * min(M, n_q))))
    return float(np.sqrt(total / count))


def end_ratios(store: str, key: jax.Array, M: int, d_k: int, d_v: int | None = None, *, queries: int = 512,
               per_store: int = 64, knob: float | None = None, max_elements: int = 2**25) -> tuple[float, float]:
    """A written store's ratio for its newest and for its oldest pair of M, each over `queries` stores.

    The same program (and draws) as interference_ratio's, which queries both ends of every store it draws.
    """
    program, _, batch = _program(store, M, d_k, d_v, queries, per_store, max_elements)
    calls = math.ceil(queries / batch)
    _, _, newest, oldest = _draw(program, store, key, M, d_k, knob, calls)
    return float(np.sqrt(newest / (calls * batch))), float(np.sqrt(oldest / (calls * batch)))


def _program(store: str, M: int, d_k: int, d_v: int | None, queries: int, per_store: int, max_elements: int):
    d_v = d_k if d_v is None else d_v
    N = store_rows(M)
    n_q = min(per_store, N)
    features = 2 * MAX_FEATURES if store == "performer" else 0  # phi of the keys and of the queries
    batch = max(1, min(math.ceil(queries / n_q), max_elements // (N * (n_q + d_v + d_k + features))))
    return _pooled(store, N, d_k, d_v, n_q, batch), n_q, batch


def _draw(program: Callable, store: str, key: jax.Array, M: int, d_k: int, knob, calls: int) -> np.ndarray:
    """The program's sums (pooled ratio^2, queries pooled, newest's and oldest's ratio^2) over `calls` calls."""
    knob = default_knob(store, d_k) if knob is None else knob
    if store in WRITTEN:
        check_knob(store, knob)
    seed = int(jax.random.bits(jax.random.fold_in(key, M), dtype=jnp.uint32))
    sums = np.zeros(4)
    for call in range(calls):
        sums += np.asarray(program(jax.random.key(seed + call * 7919, impl="rbg"), M, knob), np.float64)
    return sums


def store_rows(M: int) -> int:
    """Rows drawn for a store of M pairs (rows past M are empty).

    Compiling costs more than running below a few thousand pairs, so those
    share two sizes; above, where the work grows, the size follows M on a grid
    of four steps per octave, which bounds the wasted work to 19%.
    """
    for N in (256, 4096):
        if M <= N:
            return N
    return min(1 << math.ceil(math.log2(M)), 64 * math.ceil(2 ** (math.ceil(4 * math.log2(M) - 1e-9) / 4) / 64))


_CACHE: dict = {}


def _pooled(store: str, N: int, d_k: int, d_v: int, n_q: int, batch: int) -> Callable:
    sig = (store, N, d_k, d_v, n_q, batch)
    if sig not in _CACHE:
        def pooled(key, M, knob):
            offsets = features = None
            if store in WRITTEN:  # (the other stores keep their draws as they were)
                key, at = jax.random.split(key)
                offsets = jax.random.uniform(at, (batch, n_q))
            if store == "performer":  # each store its own features
                key, at = jax.random.split(key)
                features = jax.random.split(at, batch)
            X = jax.random.normal(key, (batch, N, d_k + d_v))
            ratio2, pool = jax.vmap(lambda x, o, f: query_ratios(store, x[:, :d_k], x[:, d_k:], M, n_q, knob, o, f))(
                X, offsets, features)
            ends = ratio2[:, -2:].sum(0) if store in WRITTEN else jnp.zeros(2)
            return jnp.stack([jnp.where(pool, ratio2, 0.0).sum(), pool.sum(), *ends])

        _CACHE[sig] = jax.jit(pooled)
    return _CACHE[sig]


def find_capacity(ratio: Callable[[int], float], start: int = 64, rtol: float = 0.01, max_m: int = 2**24,
                  max_steps: int = 12):
    """The M where ratio(M) crosses 1, and every (M, ratio) evaluated on the way.

    Doubling (or halving) from `start` brackets the crossing; then each step
    evaluates the crossing interpolated in log ratio against log M, plus a
    probe rtol/2 beyond it, until the bracket is narrower than rtol; the
    answer is the interpolated crossing inside the final bracket. The ratio is
    estimated from random draws, so it is monotone in M only up to noise.
    """
    seen: dict[int, float] = {}

    def at(M: int) -> float:
        if M not in seen:
            seen[M] = ratio(M)
        return seen[M]

    lo = hi = max(2, start)
    if at(lo) >= 1.0:
        while at(lo) >= 1.0:
            if lo == 2:
                return 2.0, sorted(seen.items())  # capacity below the smallest store with interference
            lo, hi = max(2, lo // 2), lo
    else:
        while at(hi) < 1.0:
            lo, hi = hi, hi * 2
            if hi > max_m:
                raise ValueError(f"ratio stays below 1 up to M={max_m}")

    def crossing(lo: int, hi: int) -> float:
        r_lo, r_hi = math.log(max(at(lo), 1e-12)), math.log(at(hi))
        t = 0.5 if r_hi <= r_lo else (0.0 - r_lo) / (r_hi - r_lo)
        return math.exp(math.log(lo) + min(max(t, 0.0), 1.0) * (math.log(hi) - math.log(lo)))

    for _ in range(max_steps):
        if hi - lo <= 1 or hi / lo - 1 <= rtol:
            break
        guess = crossing(lo, hi)
        for m in (guess, guess * (1 + rtol / 2) if at(int(round(guess))) < 1.0 else guess / (1 + rtol / 2)):
            m = min(max(int(round(m)), lo + 1), hi - 1)
            if hi - lo <= 1:
                break
            if at(m) < 1.0:
                lo = m
            else:
                hi = m
    return crossing(lo, hi), sorted(seen.items())


# -- theory ------------------------------------------------------------------


def unit_dot_moment(d: int, p: int) -> float:
    """E[s^(2p)] for s the dot product of two random unit vectors in R^d (Derivation D2, a Beta moment)."""
    return math.prod((1 + 2 * j) / (d + 2 * j) for j in range(p))


def score_moment(sigma: Callable, d: int, nodes: int = 200) -> float:
    """E[sigma(s)^2] over s = k . q of random unit vectors in R^d.

    s has density proportional to (1 - s^2)^((d-3)/2) on [-1, 1], so Gauss-Jacobi
    quadrature with alpha = beta = (d-3)/2 integrates it (exactly for polynomials).
    """
    from scipy.special import roots_jacobi

    a = (d - 3) / 2
    x, w = roots_jacobi(nodes, a, a)
    return float(np.sum(w * np.asarray(sigma(x), np.float64) ** 2) / np.sum(w))


def _score_sigma(store: str) -> Callable:
    score = "linear" if store == "hebbian" else STORES[store]
    return lambda s: np.asarray(SCORES[score](jnp.asarray(s, jnp.float32)), np.float64)


def capacity_theory(store: str, d: int, knob: float | None = None) -> float | None:
    """Exact-moment capacity for unit keys: 1 + sigma(1)^2 / E[sigma(s)^2]; None for the delta rule.

    hebbian: 1 + d; relu^p: 1 + 2 / E[s^2p] (2d, 2d(d+2)/3, 2d(d+2)(d+4)/15, plus one);
    softmax: 1 + e^2beta / E[e^2beta s], in closed form. lstsq: the read of key j is
    sum_i P_ji v_i with P the projection onto the keys' span, so ratio^2 = E[1/P_jj] - 1;
    with Gaussian keys P_jj is Beta(d/2, (M-d)/2) and E[1/P_jj] = (M-2)/(d-2), so
    ratio^2 = (M - d)/(d - 2), one at 2d - 2 (unit keys are close to it). rls: the
    same, being the ridge store (its small ridge neglected); decayed: the root of
    its pooled ratio (capacity_writes); delta: no closed form is derived.
    """
    knob = default_knob(store, d) if knob is None else knob
    if store in ("lstsq", "rls"):
        return 2.0 * d - 2.0
    if store == "decayed":
        return decayed_capacity(d, knob)
    if store in ("delta", "performer"):
        return None
    if store == "softmax":  # E[e^(t s)] = 0F1(; d/2; t^2/4), the unit-sphere moment generating function
        from scipy.special import hyp0f1

        return 1.0 + math.exp(2 * knob) / float(hyp0f1(d / 2, knob**2))
    if store in ("relu", "relu2", "relu3"):
        return 1.0 + 2.0 / unit_dot_moment(d, {"relu": 1, "relu2": 2, "relu3": 3}[store])
    sigma = _score_sigma(store)
    return 1.0 + float(sigma(1.0)) ** 2 / score_moment(sigma, d)


def capacity_formula(store: str, d: int, knob: float | None = None) -> float | None:
    """The note's formula: d, 2d, 2d, 2d^2/3, 2d^3/15, e^(2 beta (1 - beta/d)), and least squares'
    2d for RLS (D5); None where it gives none (the delta rule, the decayed store)."""
    beta = 1.0 if knob is None else knob
    return {
        "hebbian": d, "lstsq": 2 * d, "rls": 2 * d, "relu": 2 * d, "relu2": 2 * d**2 / 3, "relu3": 2 * d**3 / 15,
        "softmax": math.exp(2 * beta * (1 - beta / d)), "swiglu": 2 * d**2 / 3,
    }.get(store)


def theory_ratio(store: str, d: int, M, knob: float | None = None):
    """The expected ratio at M under the exact-moment theory (the dashed curves of the figure); None for delta."""
    M = np.asarray(M, np.float64)
    if store in ("delta", "performer"):
        return None
    if store in ("lstsq", "rls"):
        return np.sqrt(np.clip((M - d) / (d - 2), 0, None))
    if store == "decayed":
        return decayed_ratio(d, M, default_knob(store, d) if knob is None else knob)
    return np.sqrt((M - 1) / (capacity_theory(store, d, knob) - 1))
