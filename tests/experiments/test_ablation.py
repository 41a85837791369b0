"""experiments.research.ablation reads finished fit runs: deltas are paired differences of the runs' own
per-question rows, the best hand-set row is the reference run's best, runs on other questions are refused."""

import json

import numpy as np
import pytest

from experiments.research import ablation


def _run(path, ids, fitted, adapter=None, hand=None, params=('k0',)):
  path.mkdir(parents=True)
  pq = {
    'question_ids': ids,
    'fitted': {'ndcg@10': list(fitted)},
    'hand_set': {'ndcg@10': list(hand)},
    'baselines': {'bm25': {'ndcg@10': list(np.asarray(hand) * 0.5)}},
  }
  res = {
    'pipeline': 'p',
    'params': list(params),
    'per_question': pq,
    'adapter': {'per_question': {'ndcg@10': list(adapter)}} if adapter is not None else None,
    # the rows of a results.json: the variants a run fit (fit.variants) are read from them
    'summary': {'p (fitted, out of fold)': {}, **({'p (adapter, out of fold)': {}} if adapter is not None else {})},
  }
  (path / 'results.json').write_text(json.dumps(res))
  return path


def test_ablation_table(tmp_path):
  rng = np.random.default_rng(0)
  ids = [f'q{i}' for i in range(50)]
  hand = rng.random(50)
  full_s, full_a = rng.random(50), rng.random(50)
  less_s = rng.random(50)
  runs = {
    'full': _run(tmp_path / 'full', ids, full_s, full_a, hand),
    'less': _run(tmp_path / 'less', ids, less_s, None, hand, params=('x',)),
  }
  t = ablation.table(runs, reference='full', metric='ndcg@10', n_resamples=200)
  assert t['best_hand_set'] == 'hand-set p' and t['n_questions'] == 50
  rows = {(r['run'], r['kind']): r for r in t['rows']}
  assert set(rows) == {('full', 'scalar'), ('full', 'adapter'), ('less', 'scalar')}
  assert 'minus_reference' not in rows['full', 'scalar']
  assert rows['less', 'scalar']['minus_reference']['delta'] == pytest.approx(np.mean(less_s - full_s))
  assert rows['full', 'adapter']['minus_best_hand_set']['delta'] == pytest.approx(np.mean(full_a - hand))
  assert rows['full', 'adapter']['minus_own_scalar']['delta'] == pytest.approx(np.mean(full_a - full_s))
  assert '(reference)' in ablation.markdown(t)
  _run(tmp_path / 'other', ids[::-1], less_s, None, hand)
  with pytest.raises(ValueError, match='scored other questions'):
    ablation.table({**runs, 'other': tmp_path / 'other'}, reference='full', metric='ndcg@10', n_resamples=200)
