"""Intervals and paired tests (scipy / statsmodels), every one seeded explicitly."""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import stats
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


def bootstrap_ci(values: np.ndarray, *, seed: int, n_resamples: int = 10_000,
                 confidence: float = 0.95) -> Interval:
  """Mean of ``values [Q]`` with a percentile bootstrap interval (``scipy.stats.bootstrap``)."""
  v = _check(values)
  if len(v) == 0:
    return Interval(float('nan'), float('nan'), float('nan'))
  if len(v) == 1 or np.all(v == v[0]):
    return Interval(float(v.mean()), float(v.mean()), float(v.mean()))
  res = stats.bootstrap((v,), np.mean, n_resamples=n_resamples, confidence_level=confidence,
                        method='percentile', rng=np.random.default_rng(seed), vectorized=True)
  return Interval(float(v.mean()), float(res.confidence_interval.low), float(res.confidence_interval.high))


def paired_test(a: np.ndarray, b: np.ndarray, *, seed: int, n_resamples: int = 10_000,
                confidence: float = 0.95) -> PairedResult:
  """Paired comparison of two methods on the same questions.

  The interval is a percentile bootstrap of ``mean(a - b)`` over questions; the two-sided p-value
  is a paired sign-flip permutation test (``scipy.stats.permutation_test``, ``permutation_type='samples'``).
  """
  a, b = _check(a), _check(b)
  if a.shape != b.shape:
    raise ValueError(f'Shape mismatch: paired arrays {a.shape} vs {b.shape}')
  d = a - b
  ci = bootstrap_ci(d, seed=seed, n_resamples=n_resamples, confidence=confidence)
  if np.all(d == 0):
    return PairedResult(0.0, 0.0, 0.0, 1.0, len(d))
  perm = stats.permutation_test((a, b), lambda x, y, axis: np.mean(x - y, axis=axis), vectorized=True,
                                permutation_type='samples', n_resamples=n_resamples,
                                rng=np.random.default_rng(seed + 1))
  return PairedResult(ci.mean, ci.lo, ci.hi, float(perm.pvalue), len(d))


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
