"""experiments.research.plateau on a hand-made sweep folder: jobs collected with only the swept overrides, ranked,
paired against the best on the same questions; per-category paired tests of one run."""

import json

import numpy as np
import pytest

from experiments.research import plateau

IDS = [f'q{i}' for i in range(8)]
CATS = [1, 1, 1, 1, 2, 2, 2, 2]


def _job(folder, name, lam, values, *, ids=IDS):
  job = folder / name
  (job / '.hydra').mkdir(parents=True)
  (job / '.hydra' / 'overrides.yaml').write_text(
    f'- ++pipeline.p.legs.cfsr.lam={lam}\n- eval.k=10\n- hydra.run.dir=x\n'
  )
  rows = [
    {'id': i, 'category': c, 'scores': {'p': {'ndcg@10': v}, 'base': {'ndcg@10': 0.5}}}
    for i, c, v in zip(ids, CATS, values)
  ]
  mean = float(np.mean(values))
  (job / 'results.json').write_text(
    json.dumps({'pipelines': {'p': {'ndcg@10': mean, 'ci95': {'ndcg@10': [0, 1]}}}, 'per_question': rows})
  )


def test_collect_rank_and_pair_against_the_best(tmp_path):
  _job(tmp_path, '0', 0.001, [0.2] * 8)
  _job(tmp_path, '1', 0.005, [0.9, 0.1] * 4)
  _job(tmp_path, '2', 0.02, [0.6] * 8)
  recs = plateau.collect(tmp_path, metric='ndcg@10')
  assert [r['job'] for r in recs] == ['0', '1', '2'] and recs[1]['params'] == {
    'legs.cfsr.lam': '0.005'
  }  # eval.k not swept
  ranked = plateau.plateau(recs, n_resamples=500)
  assert [r['job'] for r in ranked] == ['2', '1', '0']
  assert ranked[0]['vs_best']['delta'] == 0.0 and ranked[0]['on_plateau']
  assert ranked[2]['vs_best']['delta'] == pytest.approx(0.2 - 0.6) and not ranked[2]['on_plateau']
  assert ranked[1]['vs_best']['delta'] == pytest.approx(0.5 - 0.6) and ranked[1]['on_plateau']  # noisy: CI holds 0
  table = plateau.markdown(ranked, metric='ndcg@10', title='t')
  assert '3 configurations, 8 questions' in table and '| 1 | 2 | legs.cfsr.lam=0.02 |' in table
  _job(tmp_path, '3', 0.1, [0.6] * 8, ids=[f'x{i}' for i in range(8)])
  with pytest.raises(ValueError, match='other questions'):
    plateau.plateau(plateau.collect(tmp_path, metric='ndcg@10'), n_resamples=100)


def test_paired_by_category(tmp_path):
  _job(tmp_path, 'run', 0.005, [1.0, 0.8, 0.6, 0.4, 0.5, 0.5, 0.5, 0.5])
  res = plateau.load_run(tmp_path / 'run')
  tests = plateau.paired_by_category(res, ['p'], ['base', 'p'], metric='ndcg@10', n_resamples=200)
  assert [(t['baseline'], t['category']) for t in tests] == [('base', 'all'), ('base', '1'), ('base', '2')]
  assert tests[1]['row_mean'] == pytest.approx(0.7) and tests[1]['delta'] == pytest.approx(0.2)
  assert tests[2]['delta'] == pytest.approx(0.0) and tests[0]['n'] == 8
  assert '| p | base | 1 | 4 |' in plateau.paired_markdown(tests)


def _weights_job(folder, name, cos_w, bm25_w, values):
  job = folder / name
  (job / '.hydra').mkdir(parents=True)
  (job / '.hydra' / 'overrides.yaml').write_text(
    f'- ++pipeline.p.legs.cos.weight={cos_w}\n- ++pipeline.p.legs.bm25.weight={bm25_w}\n- ++pipeline.p.k0=20\n'
  )
  rows = [{'id': i, 'category': c, 'scores': {'p': {'ndcg@10': v}}} for i, c, v in zip(IDS, CATS, values)]
  (job / 'results.json').write_text(
    json.dumps(
      {'pipelines': {'p': {'ndcg@10': float(np.mean(values)), 'ci95': {'ndcg@10': [0, 1]}}}, 'per_question': rows}
    )
  )


def test_knobs_sharing_a_last_name_keep_their_full_paths(tmp_path):
  """legs.cos.weight and legs.bm25.weight both end in 'weight': each keeps its own column, label and plot axis."""
  _weights_job(tmp_path, '0', 0.5, 2.0, [0.9] * 8)
  _weights_job(tmp_path, '1', 0.5, 1.0, [0.5] * 8)
  _weights_job(tmp_path, '2', 1.0, 2.0, [0.4] * 8)
  ranked = plateau.plateau(plateau.collect(tmp_path, metric='ndcg@10'), n_resamples=200)
  assert ranked[0]['params'] == {'legs.cos.weight': '0.5', 'legs.bm25.weight': '2.0'}  # k0 not swept
  table = plateau.markdown(ranked, metric='ndcg@10')
  assert '| 1 | 0 | legs.cos.weight=0.5, legs.bm25.weight=2.0 |' in table
  fig = plateau.plot(ranked, metric='ndcg@10')
  assert {ax.get_xlabel() for ax in fig.axes[2:]} == {'legs.cos.weight', 'legs.bm25.weight'}


def test_a_grid_folder_is_read_with_full_paths(tmp_path):
  from engram_jax.eval import grid

  rng = np.random.default_rng(0)
  scores = np.stack([np.full(8, 0.5), np.full(8, 0.9), rng.random(8) * 0.1, np.full(8, 0.6)])
  res = grid.GridResult(
    pipeline='p',
    paths=['legs.cos.weight', 'legs.bm25.weight'],
    points={'legs.cos.weight': np.array([0.5, 0.5, 1.0, 1.0]), 'legs.bm25.weight': np.array([1.0, 2.0, 1.0, 2.0])},
    question_ids=IDS,
    episode_ids=['e'] * 8,
    categories=CATS,
    scores={'ndcg@10': scores},
    retrieved={},
    k=10,
    info={},
  )
  grid.save_npz(res, tmp_path / 'grid.npz')
  (tmp_path / 'grid.json').write_text(json.dumps({'metric': 'ndcg@10'}))
  plateau.main([str(tmp_path), '--n-resamples', '200'])
  text = (tmp_path / 'plateau.md').read_text()
  assert '4 configurations, 8 questions' in text
  assert '| 1 | 1 | legs.cos.weight=0.5, legs.bm25.weight=2 |' in text
  assert (tmp_path / 'plateau.png').is_file()
