"""Intervals and paired tests: coverage sanity, seeding, and agreement with textbook formulas."""

import numpy as np
import pytest
from scipy import stats as sps

from engram_jax.metrics import stats


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
    ref = sps.bootstrap(
      (v,), np.mean, n_resamples=10_000, method='percentile', rng=np.random.default_rng(8), vectorized=True
    ).confidence_interval
    se = v.std(ddof=1) / np.sqrt(len(v))
    assert abs(ours.lo - ref.low) < 0.1 * se and abs(ours.hi - ref.high) < 0.1 * se


def test_sign_flip_p_matches_scipy_permutation_test():
  rng = np.random.default_rng(5)
  for shift in (0.0, 0.01, 0.02, 0.04):
    a = rng.random(400)
    b = a + shift + rng.normal(0, 0.1, 400)
    ours = stats.paired_test(a, b, seed=3).p
    ref = sps.permutation_test(
      (a, b),
      lambda x, y, axis: np.mean(x - y, axis=axis),
      vectorized=True,
      permutation_type='samples',
      n_resamples=10_000,
      rng=np.random.default_rng(11),
    ).pvalue
    assert abs(ours - ref) < 0.02 + 0.1 * ref


def test_batched_rows_equal_single_calls_and_reruns():
  rng = np.random.default_rng(6)
  v = rng.random((11, 250))  # more rows than one gather's lanes
  batch = stats.bootstrap_cis(v, seed=9)
  assert batch == [stats.bootstrap_ci(row, seed=9) for row in v] == stats.bootstrap_cis(v, seed=9)
  w = rng.random((11, 250))
  paired = stats.paired_tests(v, w, seed=9)
  assert paired == [stats.paired_test(x, y, seed=9) for x, y in zip(v, w)]
  assert stats.bootstrap_ci(v[0], seed=10) != batch[0]


def test_bootstrap_means_rows_are_bitwise_batch_invariant():
  rng = np.random.default_rng(12)
  v = np.concatenate([rng.random((5, 333)), rng.choice([0.0, 0.5, 1.0], (5, 333)), np.full((1, 333), 0.25)])
  whole = stats.bootstrap_means(v, seed=4, n_resamples=2345)
  assert whole.shape == (11, 2345)
  assert np.array_equal(whole, stats.bootstrap_means(v, seed=4, n_resamples=2345))
  for i in (0, 7, 10):
    assert np.array_equal(whole[i], stats.bootstrap_means(v[i], seed=4, n_resamples=2345)[0])
  assert np.array_equal(whole[[3, 1]], stats.bootstrap_means(v[[3, 1]], seed=4, n_resamples=2345))
  assert np.all(whole[10] == 0.25)


@pytest.mark.parametrize('q', [1, 2, 90, 1986, 70_000])
def test_bootstrap_means_is_the_documented_draw(q):
  """The replicates are the means of ``v[idx]`` for the documented draw (uint16 indices, uint32 past 65,536
  questions, in blocks of ``chunk_size(Q)`` resamples), to ~1e-7 of the values' spread (float32 deviations)."""
  v = np.random.default_rng(q).random((2, q)) * 10 - 3
  r = 100 if q > 10_000 else 700
  got = stats.bootstrap_means(v, seed=5, n_resamples=r)
  rng, c = np.random.default_rng(5), stats.chunk_size(q)
  dtype = np.uint16 if q <= 1 << 16 else np.uint32
  assert stats.index_dtype(q) is dtype
  ref = np.concatenate(
    [v[:, rng.integers(0, q, size=(q, min(c, r - s)), dtype=dtype)].mean(axis=1) for s in range(0, r, c)], axis=1
  )
  np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6)


def test_bootstrap_means_on_a_binary_grid_are_float64_exact():
  v = np.random.default_rng(15).choice([0.0, 0.25, 0.5, 1.0], (3, 777))
  got = stats.bootstrap_means(v, seed=6, n_resamples=500)
  rng = np.random.default_rng(6)
  ref = np.concatenate(
    [
      v[:, rng.integers(0, 777, size=(777, min(168, 500 - s)), dtype=np.uint16)].mean(axis=1)
      for s in range(0, 500, 168)
    ],
    axis=1,
  )
  assert stats.chunk_size(777) == 168
  np.testing.assert_allclose(got, ref, rtol=0, atol=1e-15)


def test_degenerate_rows():
  v = np.array([[0.3] * 50, list(np.linspace(0, 1, 50))])
  flat, spread = stats.bootstrap_cis(v, seed=0)
  mu = v[0].mean()
  assert flat == stats.Interval(mu, mu, mu) and spread.lo < spread.hi
  assert stats.bootstrap_ci(np.array([0.7]), seed=0) == stats.Interval(0.7, 0.7, 0.7)
  empty = stats.bootstrap_ci(np.zeros(0), seed=0)
  assert all(np.isnan([empty.mean, empty.lo, empty.hi]))
  assert np.all(np.isnan(stats.bootstrap_means(np.zeros((2, 0)), seed=0, n_resamples=100)))
  a = np.random.default_rng(0).integers(0, 64, 60) / 64
  same = stats.paired_test(a, a.copy(), seed=0)
  assert (same.delta, same.lo, same.hi, same.p) == (0.0, 0.0, 0.0, 1.0)
  shifted = stats.paired_test(a + 0.25, a, seed=0)  # exactly constant differences
  assert (shifted.delta, shifted.lo, shifted.hi) == (0.25, 0.25, 0.25) and shifted.p < 1e-3
  none = stats.paired_test(np.zeros(0), np.zeros(0), seed=0)  # no questions: no difference (NaN), not a zero one
  assert none.n == 0 and np.all(np.isnan([none.delta, none.lo, none.hi, none.p]))
  assert np.array_equal(stats.sign_flip_pvalues(np.zeros((2, 0)), seed=0), [1.0, 1.0])


def test_paired_intervals_are_differences_of_the_shared_replicates():
  rng = np.random.default_rng(13)
  a, b = rng.random((3, 200)), rng.random((3, 200))
  reps = stats.bootstrap_means(np.concatenate([a, b]), seed=2, n_resamples=3000)
  cis = stats.percentile_intervals(a - b, reps[:3] - reps[3:])
  for row, (res, ci) in enumerate(zip(stats.paired_tests(a, b, seed=2, n_resamples=3000), cis)):
    assert (res.delta, res.lo, res.hi) == (ci.mean, ci.lo, ci.hi) and res.delta == np.mean(a[row] - b[row])
    alone = [stats.bootstrap_means(x[row], seed=2, n_resamples=3000)[0] for x in (a, b)]
    assert np.array_equal(alone[0] - alone[1], reps[row] - reps[3 + row])


def test_sign_table_and_batch_invariant_pvalues():
  rng = np.random.default_rng(14)
  d = rng.normal(size=(3, 21))
  table = stats.sign_table(d)
  padded = np.concatenate([d, np.zeros((3, 3))], axis=1)
  for b, v in ((0, 0), (0, 255), (1, 0b10110101), (2, 0b00000111)):
    signs = np.array([1.0 if (v >> j) & 1 else -1.0 for j in range(8)])
    np.testing.assert_allclose(table[256 * b + v], padded[:, 8 * b : 8 * b + 8] @ signs, rtol=0, atol=1e-12)
  d = np.concatenate([rng.normal(0.1, 1, (4, 333)), rng.choice([-1.0, -0.5, 0.0, 0.5, 1.0], (4, 333))])
  batch = stats.sign_flip_pvalues(d, seed=3, n_resamples=2000)
  assert np.array_equal(batch, [stats.sign_flip_pvalues(row, seed=3, n_resamples=2000)[0] for row in d])
  assert np.array_equal(batch, stats.sign_flip_pvalues(d, seed=3, n_resamples=2000))
