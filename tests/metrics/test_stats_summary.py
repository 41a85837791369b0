"""report.summarize: one shared bootstrap pass gives the same numbers as per-row calls, whatever the threads."""

import numpy as np
import pytest

from engram_jax.eval.evaluation import EvalResult
from engram_jax.metrics import report, stats

R = 1500


def _result() -> EvalResult:
  rng = np.random.default_rng(0)
  cats = [int(c) for c in rng.choice([1, 2, 4], 300, p=[0.5, 0.3, 0.2])]
  scores = {}
  for p in range(3):
    hit = rng.random(300) < 0.4 + 0.1 * p
    scores[f'p{p}'] = {
      'ndcg@10': np.where(hit, rng.random(300), 0.0),
      'hit@10': hit.astype(float),
      'recall@10': rng.choice([0.0, 0.5, 1.0], 300),
    }
  ids = [str(i) for i in range(300)]
  return EvalResult(ids, ids, cats, [1] * 300, scores, {p: [[]] * 300 for p in scores}, 10)


@pytest.mark.parametrize('workers', [1, 2])
def test_summarize_equals_per_row_calls(monkeypatch, workers):
  monkeypatch.setattr(stats, 'workers', lambda: workers)
  res = _result()
  names = {1: 'one', 4: 'four'}
  out = report.summarize(res, category_names=names, seed=3, n_resamples=R, baselines=('p0', 'p1', 'absent'))
  assert out == report.summarize(res, category_names=names, seed=3, n_resamples=R, baselines=('p0', 'p1', 'absent'))
  cats = np.asarray(res.categories)
  for name, per_metric in res.scores.items():
    e = out[name]
    assert set(e) == {'ci95', 'by_category', 'paired', *per_metric}
    for m, v in per_metric.items():
      ci = report.interval(v, m, seed=3, n_resamples=R)
      assert (e[m], *e['ci95'][m]) == (ci.mean, ci.lo, ci.hi)
      for c in (1, 2, 4):
        label = report.category_label(c, names)
        ci = report.interval(v[cats == c], m, seed=3, n_resamples=R)
        block = e['by_category'][label]
        assert block['n'] == int(np.sum(cats == c)) and (block[m], *block['ci95'][m]) == (ci.mean, ci.lo, ci.hi)
    bases = [b for b in ('p0', 'p1') if b != name]
    assert sorted(e['paired']) == sorted(f'vs {b}' for b in bases)
    for b in bases:
      for m, v in per_metric.items():
        assert e['paired'][f'vs {b}'][m] == report.paired(v, res.scores[b][m], m, seed=3, n_resamples=R)
  assert 'mcnemar_p' in out['p2']['paired']['vs p0']['hit@10']
  assert 'mcnemar_p' not in out['p2']['paired']['vs p0']['ndcg@10']


def test_summarize_without_baselines_or_bootstrap_rows():
  res = _result()
  res.scores = {p: {'hit@10': ms['hit@10']} for p, ms in res.scores.items()}
  out = report.summarize(res, category_names={}, seed=0, n_resamples=200)
  iv = stats.wilson_ci(res.scores['p1']['hit@10'])
  assert (out['p1']['hit@10'], *out['p1']['ci95']['hit@10']) == (iv.mean, iv.lo, iv.hi)
  assert all(not e['paired'] for e in out.values())


def test_per_question_records_equal_a_plain_loop():
  """report.per_question (score rows converted once) gives each question's record as a loop of ``float(v[i])``
  gives it, for float32, float64, int and bool score rows (always Python floats in the file)."""
  rng = np.random.default_rng(0)
  q = 7
  res = EvalResult(
    question_ids=[f'q{i}' for i in range(q)],
    episode_ids=['e'] * q,
    categories=[1, 2, 'x', 1, 2, 1, 3],
    n_gold=list(range(q)),
    scores={
      'a': {'m32': rng.random(q).astype(np.float32), 'm64': rng.random(q)},
      'b': {'int': rng.integers(0, 2, q), 'bool': rng.random(q) > 0.5},
    },
    retrieved={'a': [[f'd{i}', f'd{i + 1}'] for i in range(q)], 'b': [[] for _ in range(q)]},
    k=2,
  )
  want = [
    {
      'id': qid,
      'episode': res.episode_ids[i],
      'category': res.categories[i],
      'n_gold': res.n_gold[i],
      'scores': {p: {m: float(v[i]) for m, v in ms.items()} for p, ms in res.scores.items()},
      'retrieved': {p: ids[i] for p, ids in res.retrieved.items()},
    }
    for i, qid in enumerate(res.question_ids)
  ]
  got = report.per_question(res)
  assert got == want
  assert all(type(v) is float for r in got for ms in r['scores'].values() for v in ms.values())
