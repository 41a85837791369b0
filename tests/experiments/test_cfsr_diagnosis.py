"""experiments.research.cfsr_diagnosis on a small episode: the exact NNLS is optimal, the PG solver is not better
than it, ranks and NDCG follow the shared tie rule, and the per-question record is complete."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'ops'))
import ops_testing  # noqa: E402

from experiments.research import cfsr_diagnosis as D  # noqa: E402


def test_ranked_puts_later_items_first_on_ties_and_unranked_last():
  s = np.array([0.5, -np.inf, 0.9, 0.5])
  assert D.ranked(s).tolist() == [2, 3, 0, 1]
  assert D.best_gold_rank(s, np.array([True, False, False, False])) == 3


def test_diagnose_episode_records():
  arr = ops_testing.small_arrays()
  rows = D.diagnose_episode(arr, 2, pool=8, lam=0.005, w=0.9, iterations=80, k=5)
  assert len(rows) == 2
  for r in rows:
    assert r['pool'] == 8 and r['n_items'] == 12
    assert r['pg_rel_gap'] >= -1e-6  # the exact solution is the optimum
    assert 0 <= r['support_exact'] <= r['pool'] and 0 <= r['support'] <= r['pool']
    for name in ('cosine', 'cfsr', 'cfsr_exact', 'cfsr_w0.5'):
      assert 0.0 <= r[f'ndcg@5_{name}'] <= 1.0
    assert r['gold_rank_cosine'] >= 1


def test_exact_nnls_ridge_is_nonnegative_and_optimal():
  rng = np.random.default_rng(0)
  c = rng.normal(size=(6, 4))
  z = rng.normal(size=4)
  a = D.exact_nnls_ridge(c, z, 0.01)
  assert (a >= 0).all()
  f = D.objective(c, z, a, 0.01)
  for _ in range(50):  # no feasible perturbation does better
    b = np.maximum(a + 0.05 * rng.normal(size=6), 0.0)
    assert D.objective(c, z, b, 0.01) >= f - 1e-12
