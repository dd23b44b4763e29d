"""The classical Hopfield network (Chapter 6's ancestor; the reading list's 0.14 N).

Patterns xi in {-1, +1}^N are written by the Hebbian rule W = (1/N) sum_mu xi xi^T
with a zero diagonal, and read by the sign update s <- sign(W s); a unit whose
field is exactly zero keeps its state (so a tie is no flip). A pattern is
stored when it is a fixed point, or close to one. How many random patterns it
holds depends on which "stored" is meant, and each criterion has its own law:

* every bit of a pattern stable (the pattern an exact fixed point) for at least
  99% of the patterns: the bits of one pattern must all survive, so the per-bit
  error must fall like 1/N, and the count grows like N / (2 ln N) (McEliece et
  al. 1987; N / (4 ln N) for all patterns at once), about 0.06 to 0.08 N at
  N = 100 to 400;
* at most 1% of bits flipped by one update from the pattern: bit i's field
  times xi_i is (N - 1)/N plus crosstalk of variance (M - 1)(N - 1)/N^2, so the
  bit flips with probability Phi(-sqrt((N - 1)/(M - 1))), 1% at M = 1 + 0.185 (N - 1);
* at most 1% of bits wrong at the fixed point the updates reach from the
  pattern: Amit, Gutfreund and Sompolinsky's regime, whose retrieval states
  (at most 1.6% of bits wrong) vanish at M = 0.138 N as N grows, after which the
  state falls far from the pattern; finite N smears the drop.

Everything here is numpy: the patterns are small and the probe's search
evaluates a few dozen M per N.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import ndtr, ndtri

CRITERIA = ("patterns_fixed", "bits_one_update", "bits_converged")


def hebbian_weights(X: np.ndarray) -> np.ndarray:
    """W = X^T X / N with a zero diagonal, for patterns X [..., M, N] in {-1, +1}; [..., N, N]."""
    N = X.shape[-1]
    W = np.swapaxes(X, -1, -2) @ X / N
    return W * (1 - np.eye(N, dtype=W.dtype))


def sign_update(W: np.ndarray, S: np.ndarray) -> np.ndarray:
    """One synchronous update of the states S [..., P, N]: sign(W s) per state, a zero field keeping its unit."""
    field = S @ W  # W is symmetric: row s W is (W s)^T
    return np.where(field > 0, 1, np.where(field < 0, -1, S)).astype(S.dtype)


def converge(W: np.ndarray, S: np.ndarray, max_updates: int = 50) -> np.ndarray:
    """Updates until no unit changes or max_updates (a synchronous update may end on a 2-cycle)."""
    for _ in range(max_updates):
        new = sign_update(W, S)
        if np.array_equal(new, S):
            break
        S = new
    return S


def recall_errors(X: np.ndarray, max_updates: int = 50) -> dict[str, np.ndarray]:
    """Per pattern of X [..., M, N], each started at itself: `flipped_one_update` (the fraction of
    bits one update flips), `fixed` (no bit flips) and `wrong_converged` (the fraction of bits
    wrong where the updates stop)."""
    W = hebbian_weights(X)
    one = sign_update(W, X)
    flipped = np.mean(one != X, axis=-1)
    end = converge(W, one, max_updates - 1)
    return {"flipped_one_update": flipped, "fixed": flipped == 0, "wrong_converged": np.mean(end != X, axis=-1)}


def stored(X: np.ndarray, criterion: str, tolerance: float = 0.01) -> bool:
    """Whether the patterns X [trials, M, N] are held under `criterion` (one of CRITERIA), pooling the trials:
    a share of at least 1 - tolerance exactly fixed, or a mean bit error at most tolerance."""
    e = recall_errors(X, max_updates=10 if criterion == "bits_converged" else 1)
    if criterion == "patterns_fixed":
        return bool(np.mean(e["fixed"]) >= 1 - tolerance)
    return bool(np.mean(e["flipped_one_update" if criterion == "bits_one_update" else "wrong_converged"])
                <= tolerance)


def capacity(N: int, criterion: str, rng: np.random.Generator, *, patterns: int | None = None,
             tolerance: float = 0.01) -> int:
    """The largest M at which random patterns in {-1, +1}^N are held under `criterion`.

    One pool of trials x N/4 patterns (above every criterion's capacity) is drawn
    and a store of M holds the first M of each trial, so the statistic moves with
    M alone (nested stores), and a bisection on M finds where it fails.
    trials = ceil(patterns / (N/8)): about `patterns` patterns pooled near the capacity
    (None: 4000 for patterns_fixed, whose 1% of unstable patterns needs them, and
    1000 for the bit criteria, which pool N bits per pattern).
    """
    patterns = patterns or (4000 if criterion == "patterns_fixed" else 1000)
    m_max = N // 4
    trials = math.ceil(patterns / max(N // 8, 1))
    pool = rng.choice(np.array([-1.0, 1.0]), size=(trials, m_max, N)).astype(np.float32)
    held = lambda M: stored(pool[:, :M], criterion, tolerance)  # noqa: E731
    if not held(1):
        return 0
    lo, hi = 1, m_max  # held(lo); hi is the first M assumed to fail
    if held(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if held(mid) else (lo, mid)
    return lo


def flip_probability(N: int, M) -> np.ndarray:
    """The Gaussian estimate of the chance one update flips a bit of a stored pattern: Phi(-sqrt((N-1)/(M-1)))."""
    M = np.asarray(M, np.float64)
    return ndtr(-np.sqrt((N - 1) / np.maximum(M - 1, 1e-12)))


def capacity_theory(N: int, criterion: str, tolerance: float = 0.01) -> float:
    """The Gaussian-crosstalk estimate of each criterion's capacity (continuous in M).

    patterns_fixed: (1 - p)^N = 1 - tolerance with p the flip probability (bits taken
    as independent); bits_one_update: p = tolerance; bits_converged: 0.138 N, the
    large-N limit (no finite-N formula).
    """
    if criterion == "bits_converged":
        return 0.138 * N
    p = -math.expm1(math.log1p(-tolerance) / N) if criterion == "patterns_fixed" else tolerance
    return 1.0 + (N - 1) / float(ndtri(p)) ** 2


def asymptotic(N: int, criterion: str) -> float:
    """The large-N law each criterion follows: N / (2 ln N), 0.185 N, 0.138 N."""
    return {"patterns_fixed": N / (2 * math.log(N)), "bits_one_update": N / float(ndtri(0.01)) ** 2,
            "bits_converged": 0.138 * N}[criterion]
