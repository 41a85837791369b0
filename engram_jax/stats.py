"""Intervals and paired tests, batched and seeded explicitly.

The percentile bootstrap and the paired sign-flip permutation test are array code: one ``[R, Q]`` draw per call,
shared by every row of a ``[M, Q]`` batch (a run computes all its intervals in a few calls). ``scipy.stats``
(``bootstrap``, ``permutation_test``) is the reference in the tests, not the hot path. Wilson intervals and exact
McNemar tests for 0/1 outcomes come from statsmodels.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.proportion import proportion_confint


@dataclasses.dataclass(frozen=True)
class Interval:
  mean: float
  lo: float
  hi: float

  def to_dict(self) -> dict[str, float]:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class PairedResult:
  delta: float  # mean(a - b)
  lo: float
  hi: float
  p: float
  n: int

  def to_dict(self) -> dict[str, float]:
    return dataclasses.asdict(self)


def _check(values: np.ndarray) -> np.ndarray:
  values = np.asarray(values, np.float64)
  if values.ndim != 1:
    raise ValueError(f'Shape mismatch: expected [Q], got {values.shape}')
  if not np.all(np.isfinite(values)):
    raise ValueError('non-finite per-question values')
  return values


CHUNK = 1024  # resamples drawn and reduced at a time (memory: CHUNK x Q float32)


def _as_matrix(values: np.ndarray) -> np.ndarray:
  v = np.asarray(values, np.float64)
  if v.ndim == 1:
    v = v[None]
  if v.ndim != 2:
    raise ValueError(f'Shape mismatch: expected [Q] or [M, Q], got {v.shape}')
  if not np.all(np.isfinite(v)):
    raise ValueError('non-finite per-question values')
  return v


def bootstrap_means(values: np.ndarray, *, seed: int, n_resamples: int = 10_000) -> np.ndarray:
  """Bootstrap replicates of the mean of each row of ``values [M, Q]``: ``[M, R]``.

  One draw of ``R`` resamples of the ``Q`` question indices (``numpy.random.default_rng(seed)``, in chunks of
  :data:`CHUNK`) is shared by every row, so a row's replicates depend only on
  ``(seed, Q, R)`` and its values: the same whether it is bootstrapped alone or in a batch.
  """
  v = _as_matrix(values)
  m, q = v.shape
  rng = np.random.default_rng(seed)
  out = np.empty((m, n_resamples), np.float64)
  for start in range(0, n_resamples, CHUNK):
    r = min(CHUNK, n_resamples - start)
    idx = rng.integers(0, q, size=(r, q))
    for i in range(m):  # a gather per row: cheaper than multiplicity counts for the few rows of a run
      out[i, start:start + r] = v[i][idx].mean(axis=1)
  return out


def bootstrap_cis(values: np.ndarray, *, seed: int, n_resamples: int = 10_000,
                  confidence: float = 0.95) -> list[Interval]:
  """Means of the rows of ``values [M, Q]`` with percentile bootstrap intervals, all from one shared draw.

  A constant row (or ``Q == 1``) gets the degenerate interval ``[mean, mean]``; ``Q == 0`` gives NaNs. Agrees with
  ``scipy.stats.bootstrap(..., method='percentile')`` within Monte-Carlo error (checked in the tests).
  """
  v = _as_matrix(values)
  if v.shape[1] == 0:
    return [Interval(float('nan'), float('nan'), float('nan')) for _ in range(v.shape[0])]
  means = v.mean(axis=1)
  alpha = (1 - confidence) / 2
  lo, hi = np.percentile(bootstrap_means(v, seed=seed, n_resamples=n_resamples), [100 * alpha, 100 * (1 - alpha)],
                         axis=1)
  constant = np.all(v == v[:, :1], axis=1)
  return [Interval(float(mu), float(mu), float(mu)) if c else Interval(float(mu), float(a), float(b))
          for mu, a, b, c in zip(means, lo, hi, constant)]


def bootstrap_ci(values: np.ndarray, *, seed: int, n_resamples: int = 10_000,
                 confidence: float = 0.95) -> Interval:
  """Mean of ``values [Q]`` with a percentile bootstrap interval (:func:`bootstrap_cis` of one row)."""
  return bootstrap_cis(_check(values)[None], seed=seed, n_resamples=n_resamples, confidence=confidence)[0]


def sign_flip_pvalues(diffs: np.ndarray, *, seed: int, n_resamples: int = 10_000) -> np.ndarray:
  """Two-sided paired sign-flip permutation p-values of ``mean(d) = 0`` for each row of ``diffs [P, Q]``: ``[P]``.

  The null distribution flips the sign of each question's difference with probability 1/2 (one shared ``[R, Q]``
  draw from ``default_rng(seed)``); ``p = min(1, 2 min(P(T >= t), P(T <= t)))`` with the observed statistic
  counted once in each tail (``(count + 1) / (R + 1)``), as ``scipy.stats.permutation_test`` does for random
  permutations. A row of zeros gets p = 1.
  """
  d = _as_matrix(diffs)
  p_rows, q = d.shape
  observed = d.mean(axis=1)
  rng = np.random.default_rng(seed)
  greater = np.zeros(p_rows, np.int64)
  less = np.zeros(p_rows, np.int64)
  tol = 1e-14 * np.maximum(np.abs(observed), 1.0)
  for start in range(0, n_resamples, CHUNK):
    r = min(CHUNK, n_resamples - start)
    signs = rng.integers(0, 2, size=(r, q)).astype(np.float64) * 2.0 - 1.0
    null = (signs @ d.T) / q  # [r, P]
    greater += np.sum(null >= observed - tol, axis=0)
    less += np.sum(null <= observed + tol, axis=0)
  p = np.minimum(1.0, 2.0 * np.minimum((greater + 1) / (n_resamples + 1), (less + 1) / (n_resamples + 1)))
  return np.where(np.all(d == 0, axis=1), 1.0, p)


def paired_tests(a: np.ndarray, b: np.ndarray, *, seed: int, n_resamples: int = 10_000,
                 confidence: float = 0.95) -> list[PairedResult]:
  """Paired comparisons of the rows of ``a [P, Q]`` and ``b [P, Q]`` (same questions), in one batched pass.

  The interval is a percentile bootstrap of ``mean(a - b)`` over questions (:func:`bootstrap_cis`, seed
  ``seed``); the two-sided p-value is a paired sign-flip permutation test (:func:`sign_flip_pvalues`, seed
  ``seed + 1``).
  """
  a, b = _as_matrix(a), _as_matrix(b)
  if a.shape != b.shape:
    raise ValueError(f'Shape mismatch: paired arrays {a.shape} vs {b.shape}')
  d = a - b
  cis = bootstrap_cis(d, seed=seed, n_resamples=n_resamples, confidence=confidence)
  ps = sign_flip_pvalues(d, seed=seed + 1, n_resamples=n_resamples)
  return [PairedResult(0.0, 0.0, 0.0, 1.0, d.shape[1]) if np.all(row == 0)
          else PairedResult(ci.mean, ci.lo, ci.hi, float(p), d.shape[1]) for row, ci, p in zip(d, cis, ps)]


def paired_test(a: np.ndarray, b: np.ndarray, *, seed: int, n_resamples: int = 10_000,
                confidence: float = 0.95) -> PairedResult:
  """Paired comparison of two methods on the same questions ``a [Q]``, ``b [Q]`` (:func:`paired_tests` of one
  row)."""
  a, b = _check(a), _check(b)
  if a.shape != b.shape:
    raise ValueError(f'Shape mismatch: paired arrays {a.shape} vs {b.shape}')
  return paired_tests(a[None], b[None], seed=seed, n_resamples=n_resamples, confidence=confidence)[0]


def wilson_ci(successes: np.ndarray, *, confidence: float = 0.95) -> Interval:
  """Proportion of 0/1 ``successes [Q]`` with a Wilson interval (statsmodels)."""
  s = _check(successes)
  if not np.all((s == 0) | (s == 1)):
    raise ValueError('wilson_ci expects 0/1 outcomes')
  if len(s) == 0:
    return Interval(float('nan'), float('nan'), float('nan'))
  lo, hi = proportion_confint(int(s.sum()), len(s), alpha=1 - confidence, method='wilson')
  return Interval(float(s.mean()), float(lo), float(hi))


def mcnemar_test(a: np.ndarray, b: np.ndarray) -> float:
  """Exact McNemar p-value for paired 0/1 outcomes (statsmodels)."""
  a, b = _check(a).astype(bool), _check(b).astype(bool)
  table = [[np.sum(a & b), np.sum(a & ~b)], [np.sum(~a & b), np.sum(~a & ~b)]]
  return float(mcnemar(table, exact=True).pvalue)
