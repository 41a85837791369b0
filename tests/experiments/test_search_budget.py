"""experiments.research.search_budget runs end to end on a small LoCoMo subset (hashing embedder): every method is scored on
the held-out conversation and spends about the gradient fit's wall time."""

import json

import pytest

from tests.fit.test_fit import HAVE


@pytest.mark.slow
@pytest.mark.skipif(not HAVE, reason='needs the LoCoMo data')
def test_search_budget_small(tmp_path):
  pytest.importorskip('optuna')
  from experiments.research import search_budget

  res = search_budget.main(
    [
      '--out',
      str(tmp_path / 'out'),
      'embedder=hashing',
      'dataset.loader.conversations=[conv-30,conv-26,conv-41]',
      'fit.n_test=1',
      'fit.steps=2',
      'fit.batch_size=16',
      'eval.n_resamples=100',
      f'paths.cache_dir={tmp_path}/cache',
    ]
  )
  assert set(res) == {
    'hand-set',
    'gradient (adam, soft twins)',
    'optuna TPE',
    'grid (3 levels per knob)',
    search_budget.EXHAUSTIVE,
  }
  assert res[search_budget.EXHAUSTIVE]['evaluations'] == f'all {3**8} points, one call'
  assert 'p' in res[search_budget.EXHAUSTIVE]['vs_gradient']
  budget = res['gradient (adam, soft twins)']['wall_s']
  for label in ('optuna TPE', 'grid (3 levels per knob)'):
    assert res[label]['wall_s'] >= budget
    assert 0.0 <= res[label]['test_ndcg@10']['mean'] <= 1.0
  assert json.loads((tmp_path / 'out' / 'budget.json').read_text())['hand-set']['vs_hand_set']['delta'] == 0.0
