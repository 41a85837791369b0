"""experiments.compare: paired tests across finished runs, matched by question id."""

import json

import pytest

from engram_jax.core import runfolder
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


def _eval_run(folder, dataset, rows):
  """An evaluate results.json in ``folder``: ``rows`` = {pipeline: [values by question]}."""
  folder.mkdir(parents=True, exist_ok=True)
  n = len(next(iter(rows.values())))
  per_q = [{'id': f'q{i}', 'scores': {p: {'ndcg@10': v[i]} for p, v in rows.items()}} for i in range(n)]
  path = folder / 'results.json'
  path.write_text(json.dumps({'dataset': dataset, 'per_question': per_q}))
  runfolder.mark(folder, ['results.json'])  # a finished run's marker, as experiments.evaluate writes
  return path


def test_the_same_pipeline_in_two_runs_is_paired_by_file_not_merged(tmp_path, capsys):
  """The probe: `compare A B --pairs cosine:cosine` printed +0.0000 (the last file's row won); now a bare name
  held by two files is refused, `cosine@2:cosine@1` compares the two runs, and no --pairs pairs by name."""
  a = _eval_run(tmp_path / 'a', 'locomo', {'cosine': [0.3] * 8})
  b = _eval_run(tmp_path / 'b', 'locomo', {'cosine': [0.2] * 8})
  with pytest.raises(ValueError, match=r"in several files \(\['cosine@1', 'cosine@2'\]\)"):
    compare.main([str(a), str(b), '--pairs', 'cosine:cosine', '--n-resamples', '100'])
  rows = compare.main([str(a), str(b), '--pairs', 'cosine@2:cosine@1', '--n-resamples', '100'])
  assert rows[0]['delta'] == pytest.approx(-0.1)
  rows = compare.main([str(a), str(b), '--n-resamples', '100'])
  assert [(r['a'], r['b']) for r in rows] == [('cosine@2', 'cosine@1')] and rows[0]['delta'] == pytest.approx(-0.1)
  assert f'cosine@2 ({b}, locomo) minus cosine@1 ({a}, locomo)' in capsys.readouterr().out


def test_pairs_across_datasets_or_question_sets_are_refused(tmp_path):
  a = _eval_run(tmp_path / 'a', 'locomo', {'cosine': [0.3] * 8})
  fc = _eval_run(tmp_path / 'fc', 'fc_sh_6k', {'cosine': [0.2] * 8})
  with pytest.raises(ValueError, match="cosine@2 is on dataset 'fc_sh_6k' and cosine@1 on 'locomo'"):
    compare.main([str(a), str(fc), '--n-resamples', '100'])
  part = _eval_run(tmp_path / 'part', 'locomo', {'cosine': [0.2] * 5})
  with pytest.raises(ValueError, match=r'\(5 questions\) and cosine@1 \(8 questions\) score different question'):
    compare.main([str(a), str(part), '--n-resamples', '100'])


def test_a_fit_results_json_is_read(tmp_path):
  """A fit's results.json (per_question is a dict of vectors) crashed with a TypeError; its rows are read, and its
  dataset comes from the config_resolved.yaml beside it."""
  fit = tmp_path / 'fit'
  fit.mkdir()
  ids = [f'q{i}' for i in range(6)]
  (fit / 'results.json').write_text(
    json.dumps(
      {
        'pipeline': 'p',
        'metrics': ['ndcg@10'],
        'per_question': {
          'question_ids': ids,
          'fitted': {'ndcg@10': [0.5] * 6},
          'hand_set': {'ndcg@10': [0.25] * 6},
          'baselines': {'cosine': {'ndcg@10': [0.0] * 6}},
        },
      }
    )
  )
  (fit / 'config_resolved.yaml').write_text('dataset:\n  name: locomo\n')
  runfolder.mark(fit, ['results.json', 'config_resolved.yaml'])
  rows = compare.main(
    [str(fit / 'results.json'), '--pairs', 'p (fitted, out of fold):p (hand-set)', '--n-resamples', '100']
  )
  assert rows[0]['delta'] == pytest.approx(0.25) and rows[0]['n'] == 6
  ev = _eval_run(tmp_path / 'ev', 'locomo', {'cosine': [0.125] * 6})
  rows = compare.main(
    [str(fit / 'results.json'), str(ev), '--pairs', 'cosine@2:cosine (hand-set)@1', '--n-resamples', '100']
  )
  assert rows[0]['delta'] == pytest.approx(0.125)


def test_entry_point_prints_one_line(tmp_path):
  import subprocess
  import sys

  a = _eval_run(tmp_path / 'a', 'locomo', {'cosine': [0.3] * 8})
  out = subprocess.run(
    [sys.executable, '-m', 'experiments.compare', str(a), '--pairs', 'x:cosine'], capture_output=True, text=True
  )
  assert out.returncode == 1 and out.stderr.count('\n') == 1 and out.stderr.startswith("Error: unknown pipeline 'x'")
