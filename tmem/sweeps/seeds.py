"""Seeds as an axis: the jobs of one configuration folded into n, median, min and max of every numeric field, and
their learning curves into a median and a band.

Pure functions over plain values. A run that did not reach its target is
kept, its steps (and seconds) to the target taken as "at least" what it had:
the budget (train.steps, or more where a resume raised it) and its training
time. Such a value is right-censored: the true one is at least as large, so
every order statistic of the observed values is a lower bound of the true
one, and equals it exactly when at least k uncensored values lie at or below
the k-th observed value (a censored value below that could move above it).
An inexact statistic is an `AtLeast`, shown as `>=N`.

The interval of the median is the distribution-free one from order
statistics (the sign test's): [x_(j), x_(n+1-j)] covers the median with
probability 1 - 2 P(Binomial(n, 1/2) < j), and j is the largest rank with that
at least 95%. Below n = 6 no rank reaches 95% (n = 5 gives 93.75% with the
extremes), so no interval is given: min and max are the spread to read then.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, NamedTuple

from tmem.sweeps.runs import natural

LEVEL = 0.95  # coverage of the median's interval
STATS = ("median", "min", "max", "ci_lo", "ci_hi")  # a folded field F's columns are F:median, F:min, ...


class AtLeast(float):
    """A lower bound: the value of an order statistic that a censored run (one that stopped short of its target)
    reaches, so the true statistic is at least this."""

    def __str__(self) -> str:
        return f">={self:g}"

    __repr__ = __str__  # the csv module writes a float by its repr


class Job(NamedTuple):
    run_dir: str
    overrides: dict[str, str]  # the job's command-line overrides (key -> value text)
    fields: dict[str, Any]  # its summary, nested sections as dotted keys
    budget: int | None  # the steps it was allowed


def numeric(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def interval_rank(n: int, level: float = LEVEL) -> int | None:
    """The rank j of the median's distribution-free interval [x_(j), x_(n+1-j)], or None when n is too small for
    any rank to cover the median with probability `level`."""
    below = 0.0  # P(Binomial(n, 1/2) < j)
    for j in range(1, n // 2 + 1):
        below += math.comb(n, j - 1) / 2**n
        if 1 - 2 * below < level:
            return j - 1 or None
    return n // 2 or None


def order_statistics(values: list[float], censored: list[bool]) -> dict[str, float | None]:
    """median, min, max and the median's interval (ci_lo, ci_hi; None below n = 6) of right-censored values,
    each an AtLeast where a censored value reaches it."""
    ranked = sorted(zip(values, censored), key=lambda vc: (vc[0], vc[1]))
    xs, n = [v for v, _ in ranked], len(ranked)

    def at(k: int) -> float:  # the k-th order statistic (from 1), exact or a lower bound
        exact = sum(1 for v, c in ranked if not c and v <= xs[k - 1]) >= k
        return xs[k - 1] if exact else AtLeast(xs[k - 1])

    if n == 0:
        return dict.fromkeys(STATS)
    lo, hi = at((n + 1) // 2), at(n // 2 + 1)  # the same one for odd n
    median = lo if n % 2 else statistics.fmean([lo, hi])
    j = interval_rank(n)
    return {"median": AtLeast(median) if isinstance(lo, AtLeast) or isinstance(hi, AtLeast) else median,
            "min": at(1), "max": at(n), "ci_lo": at(j) if j else None, "ci_hi": at(n + 1 - j) if j else None}


def to_target(job: Job) -> dict[str, tuple[float, bool]]:
    """Steps and seconds to the target as (value, censored): a run that never reached it counts as its budget
    and its training time, censored. Nothing for a run with no target."""
    f = job.fields
    if f.get("target_value") is None:
        return {}
    if f.get("target_step") is not None:
        return {k: (f[k], False) for k in ("target_step", "target_seconds") if numeric(f.get(k))}
    out = {}
    if job.budget is not None:
        out["target_step"] = (job.budget, True)
    if numeric(f.get("wall_seconds")):
        out["target_seconds"] = (f["wall_seconds"], True)
    return out


def configuration(job: Job, over: str) -> tuple[tuple[str, str], ...]:
    """What a job ran, less the axis folded over: its overrides but `over`, wherever the job lies."""
    return tuple(sorted((k, v) for k, v in job.overrides.items() if k != over))


def fold(jobs: list[Job], over: str = "train.seed") -> list[dict[str, Any]]:
    """One row per configuration: its overrides, n, the folded values (`seeds`), n_reached (where the jobs have a
    target) and, for every numeric field, F:median, F:min, F:max and the median's interval F:ci_lo, F:ci_hi.

    A field counts over the jobs that report it; steps and seconds to the
    target count every job, censored where it was not reached. Text fields
    the jobs agree on are kept; `status` becomes a count of each.
    """
    groups: dict[tuple, list[Job]] = {}
    for job in jobs:
        groups.setdefault(configuration(job, over), []).append(job)
    rows = []
    for config, members in groups.items():
        seeds = sorted((j.overrides[over] for j in members if over in j.overrides), key=natural)
        row: dict[str, Any] = {**dict(config), "n": len(members), "seeds": ",".join(seeds)}
        targets = [to_target(j) for j in members]
        if any(targets):
            row["n_reached"] = sum(j.fields.get("target_step") is not None for j in members)
        statuses = [str(j.fields.get("status")) for j in members]
        row["status"] = ", ".join(f"{s} {statuses.count(s)}" for s in dict.fromkeys(statuses))
        for name in dict.fromkeys(k for j in members for k in j.fields):
            if name == "status":
                continue
            values = [(t[name] if name in t else (j.fields.get(name), False)) for j, t in zip(members, targets)]
            values = [(v, c) for v, c in values if numeric(v)]
            texts = {j.fields.get(name) for j in members}
            if values:
                for stat, v in order_statistics(*map(list, zip(*values))).items():
                    row[f"{name}:{stat}"] = v
            elif len(texts) == 1 and isinstance(next(iter(texts)), str):
                row[name] = next(iter(texts))
        rows.append(row)
    return rows


def band(curves: list[dict[int, float]]) -> list[dict[str, float]]:
    """Learning curves of one configuration's seeds as (step, n, median, min, max), at the steps every curve has:
    a band over a changing set of seeds would jump where a seed's logging does."""
    curves = [c for c in curves if c]
    if not curves:
        return []
    shared = sorted(set.intersection(*(set(c) for c in curves)))
    return [{"step": s, "n": len(curves), "median": statistics.median(c[s] for c in curves),
             "min": min(c[s] for c in curves), "max": max(c[s] for c in curves)} for s in shared]


def label(config: dict[str, Any], keys: list[str]) -> str:
    """A configuration's name in a figure or table: its values of the keys that vary (`mixer=linear`), leaving out
    the keys it does not set (one sweep's `model.positions=rope` does not name every other sweep's rows)."""
    return " ".join(f"{k}={config[k]}" for k in keys if config.get(k) not in (None, "")) or "all"


def varying(rows: list[dict[str, Any]], keys: list[str]) -> list[str]:
    """The keys among `keys` whose values differ between rows."""
    return [k for k in keys if len({str(r.get(k)) for r in rows}) > 1]
