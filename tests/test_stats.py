"""Intervals and paired tests: coverage sanity, seeding, and agreement with textbook formulas."""

import numpy as np
import pytest
from scipy import stats as sps

from engram_jax import stats


def test_bootstrap_interval_brackets_mean_and_is_seeded():
  v = np.random.default_rng(0).random(500)
  a, b = stats.bootstrap_ci(v, seed=3), stats.bootstrap_ci(v, seed=3)
  assert a == b and a.lo < v.mean() < a.hi
  se = v.std(ddof=1) / np.sqrt(len(v))
  assert abs((a.hi - a.lo) - 2 * 1.96 * se) < 0.2 * (2 * 1.96 * se)


def test_paired_test_detects_shift_and_not_noise():
  rng = np.random.default_rng(1)
  a = rng.random(400)
  shifted = stats.paired_test(a + 0.05 + rng.normal(0, 0.02, 400), a, seed=0)
  assert shifted.lo > 0 and shifted.p < 0.01
  same = stats.paired_test(a, a.copy(), seed=0)
  assert same.delta == 0 and same.p == 1.0
  noise = stats.paired_test(a + rng.normal(0, 0.05, 400), a, seed=0)
  assert noise.lo < 0 < noise.hi


def test_paired_p_agrees_with_t_test_roughly():
  rng = np.random.default_rng(2)
  a, b = rng.random(300), rng.random(300) + 0.03
  ours = stats.paired_test(a, b, seed=0).p
  t = sps.ttest_rel(a, b).pvalue
  assert abs(ours - t) < 0.05


def test_wilson_and_mcnemar():
  s = np.array([1] * 30 + [0] * 70, float)
  iv = stats.wilson_ci(s)
  assert iv.mean == 0.3 and 0.21 < iv.lo < 0.22 and 0.39 < iv.hi < 0.40
  a = np.array([1] * 20 + [0] * 80, bool)
  b = np.array([0] * 20 + [0] * 80, bool)
  assert stats.mcnemar_test(a, b) < 1e-4
  assert stats.mcnemar_test(a, a) == 1.0


def test_bad_input_raises():
  with pytest.raises(ValueError, match='non-finite'):
    stats.bootstrap_ci(np.array([0.1, np.nan]), seed=0)
  with pytest.raises(ValueError, match='Shape mismatch'):
    stats.paired_test(np.zeros(3), np.zeros(4), seed=0)
  with pytest.raises(ValueError, match='0/1'):
    stats.wilson_ci(np.array([0.5]))


def test_bootstrap_matches_scipy_within_monte_carlo_error():
  rng = np.random.default_rng(4)
  for v in (rng.random(300), (rng.random(500) < 0.3).astype(float), rng.exponential(size=120)):
    ours = stats.bootstrap_ci(v, seed=7)
    ref = sps.bootstrap((v,), np.mean, n_resamples=10_000, method='percentile', rng=np.random.default_rng(8),
                        vectorized=True).confidence_interval
    se = v.std(ddof=1) / np.sqrt(len(v))
    assert abs(ours.lo - ref.low) < 0.1 * se and abs(ours.hi - ref.high) < 0.1 * se


def test_sign_flip_p_matches_scipy_permutation_test():
  rng = np.random.default_rng(5)
  for shift in (0.0, 0.01, 0.02, 0.04):
    a = rng.random(400)
    b = a + shift + rng.normal(0, 0.1, 400)
    ours = stats.paired_test(a, b, seed=3).p
    ref = sps.permutation_test((a, b), lambda x, y, axis: np.mean(x - y, axis=axis), vectorized=True,
                               permutation_type='samples', n_resamples=10_000,
                               rng=np.random.default_rng(11)).pvalue
    assert abs(ours - ref) < 0.02 + 0.1 * ref


def test_batched_rows_equal_single_calls_and_reruns():
  rng = np.random.default_rng(6)
  v = rng.random((5, 250))
  batch = stats.bootstrap_cis(v, seed=9)
  assert batch == [stats.bootstrap_ci(row, seed=9) for row in v] == stats.bootstrap_cis(v, seed=9)
  w = rng.random((5, 250))
  paired = stats.paired_tests(v, w, seed=9)
  assert paired == [stats.paired_test(x, y, seed=9) for x, y in zip(v, w)]
  assert stats.bootstrap_ci(v[0], seed=10) != batch[0]


def test_bootstrap_chunking_does_not_change_the_draw(monkeypatch):
  v = np.random.default_rng(7).random(90)
  whole = stats.bootstrap_means(v, seed=1, n_resamples=3000)
  monkeypatch.setattr(stats, 'CHUNK', 3000)
  assert np.array_equal(whole, stats.bootstrap_means(v, seed=1, n_resamples=3000))
