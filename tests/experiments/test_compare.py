"""experiments.compare: paired tests across finished runs, matched by question id."""

import json

import pytest

from experiments import compare


def _run(path, name, values):
  rows = [{'id': f'q{i}', 'scores': {name: {'ndcg@10': v, 'hit@10': float(v > 0.5)}}} for i, v in enumerate(values)]
  path.write_text(json.dumps({'per_question': rows}))
  return path


def test_pairs_across_runs_by_question_id(tmp_path):
  a = _run(tmp_path / 'a.json', 'A', [0.9, 0.8, 0.7, 0.6, 0.9, 0.8] * 5)
  b = _run(tmp_path / 'b.json', 'B', [0.1, 0.2, 0.3, 0.4, 0.1, 0.2] * 5)
  rows = compare.main([str(a), str(b), '--pairs', 'A:B', '--n-resamples', '200'])
  nd = next(r for r in rows if r['metric'] == 'ndcg@10')
  assert nd['n'] == 30 and nd['delta'] == pytest.approx(17 / 30) and nd['lo'] > 0
  assert 'mcnemar_p' in next(r for r in rows if r['metric'] == 'hit@10')


def test_unknown_pipeline_is_a_clear_error(tmp_path):
  a = _run(tmp_path / 'a.json', 'A', [0.5, 0.6])
  with pytest.raises(ValueError, match="unknown pipeline 'Z'"):
    compare.main([str(a), '--pairs', 'A:Z'])
