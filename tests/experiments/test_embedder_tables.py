"""experiments.research.embedder_tables: the cross-embedder CFS-R table from run folders (whole ones only), the
published rows checked against the seed text, the paired differences from the runs and from per-question scores."""

import json

import numpy as np
import pytest

from engram_jax.core import runfolder
from engram_jax.core.errors import EngramError
from experiments.research import embedder_tables as et

PIPES = ('rrf_cos_bm25', 'rrf_cos_bm25_mmr_tuned', 'rrf_cos_bm25_cfs_long', 'rrf_cos_bm25_cfsr')
SEED = 'How CFS-R works\nrrf(cos, BM25, CFS-R top50 w3):   NDCG@10 0.5447, Recall@10 0.7303\nrrf: 0.5196, 0.6989\n'


def _results(shift: float) -> dict:
  rng = np.random.default_rng(0)
  base = rng.uniform(0, 1, 40)
  per_q = {p: np.clip(base + shift * i, 0, 1) for i, p in enumerate(PIPES)}
  pipelines = {}
  for p, s in per_q.items():
    cat = {
      f'{name} ({c})': {'n': 20, 'ndcg@10': float(s[c - 1 :: 2].mean()), 'recall@10': float(s[c - 1 :: 2].mean())}
      for c, name in ((1, 'multi-hop'), (2, 'temporal'))
    }
    pipelines[p] = {
      'ndcg@10': float(s.mean()),
      'recall@10': float(s.mean()),
      'ci95': {'ndcg@10': [0.1, 0.9], 'recall@10': [0.1, 0.9]},
      'by_category': cat,
      'paired': {},
    }
  pipelines[et.STACK]['paired'] = {'vs rrf_cos_bm25': {'ndcg@10': {'delta': 0.3, 'lo': 0.2, 'hi': 0.4, 'p': 2e-4}}}
  return {
    'n_questions': 40,
    'seed': 7,
    'pipelines': pipelines,
    'reference': {'rrf_cos_bm25_cfsr': {'ndcg@10': 0.5447, 'recall@10': 0.7303}},
    'per_question': [
      {'category': 1 + i % 2, 'scores': {p: {'ndcg@10': float(per_q[p][i])} for p in PIPES}} for i in range(40)
    ],
  }


def _run(tmp_path, name, results):
  folder = tmp_path / name
  folder.mkdir()
  (folder / 'results.json').write_text(json.dumps(results))
  runfolder.mark(folder, ['results.json'])
  return folder


def test_table_from_two_runs_with_the_seed_checked(tmp_path):
  seeds = tmp_path / 'seeds'
  seeds.mkdir()
  (seeds / '000_x.txt').write_text(SEED)
  a, b = _run(tmp_path, 'a', _results(0.01)), _run(tmp_path, 'b', _results(0.02))
  text = et.main([f'small={a}', f'big={b}', '--seeds', str(seeds), '--out', str(tmp_path / 't.md')])
  assert (tmp_path / 't.md').read_text() == text
  assert 'published: the CFS-R post, `000_x.txt` of the seeds' in text
  assert '| ndcg@10: pipeline | small | big | published (text-embedding-3-small) |' in text
  assert '| `rrf_cos_bm25` | +0.3000 [+0.2000, +0.4000] p <0.001 | +0.3000 [+0.2000, +0.4000] p <0.001 |' in text
  assert text.count(' * |') == 4  # the two comparisons computed here, in each run's column
  assert 'each cell small / big' in text


def test_published_numbers_must_occur_in_the_seed(tmp_path):
  seeds = tmp_path / 'seeds'
  seeds.mkdir()
  (seeds / '000_x.txt').write_text(SEED.replace('0.5447', '0.5440'))
  with pytest.raises(
    EngramError, match=r"not found in the CFS-R post 000_x.txt: \['rrf_cos_bm25_cfsr ndcg@10 0.5447'\]"
  ):
    et.main([f'a={_run(tmp_path, "a", _results(0.01))}', '--seeds', str(seeds)])


def test_an_unfinished_run_folder_is_refused(tmp_path):
  folder = tmp_path / 'r'
  folder.mkdir()
  (folder / 'results.json').write_text(json.dumps(_results(0.01)))
  with pytest.raises(EngramError, match='incomplete or mixed run folder'):
    et.main([f'a={folder}'])


def test_computed_comparison_matches_a_direct_paired_test():
  from engram_jax.metrics import paired_test

  r = _results(0.01)
  t = et.stack_vs(r, 'rrf_cos_bm25_mmr_tuned')
  want = paired_test(
    et.per_question(r, et.STACK, 'ndcg@10'), et.per_question(r, 'rrf_cos_bm25_mmr_tuned', 'ndcg@10'), seed=7
  )
  assert (t['delta'], t['lo'], t['hi'], t['source']) == (want.delta, want.lo, want.hi, 'here')
  assert et.stack_vs(r, 'nope') is None


def test_per_category_difference_is_the_paired_test_on_that_category():
  from engram_jax.metrics import paired_test

  r = _results(0.01)
  t = et.paired(r, et.STACK, 'rrf_cos_bm25', category='temporal (2)')
  sel = np.arange(40) % 2 == 1  # category 2: the odd questions
  want = paired_test(
    et.per_question(r, et.STACK, 'ndcg@10')[sel], et.per_question(r, 'rrf_cos_bm25', 'ndcg@10')[sel], seed=7
  )
  assert (t['delta'], t['lo'], t['hi'], t['n'], t['source']) == (want.delta, want.lo, want.hi, 20, 'here')
  assert et.paired(r, et.STACK, 'rrf_cos_bm25')['source'] == 'run'  # overall: the run's own test


def _tide(shift: float, datasets=('longmemeval_s', 'fc_sh_6k')) -> dict:
  rng = np.random.default_rng(1)
  hits = (rng.uniform(0, 1, 30) < 0.5).astype(float)
  per_q = {'cosine': hits, 'tide_dense': np.maximum(hits, rng.uniform(0, 1, 30) < shift)}
  out = {}
  for ds in datasets:
    metric = et.TIDE_DATASETS[ds][0]
    pipes = {
      p: {metric: float(s.mean()), 'ci95': {metric: [0.0, 1.0]}, 'by_category': {'kind': {'n': 30, metric: 0.5}}}
      for p, s in per_q.items()
    }
    pipes['tide_dense']['paired'] = {}
    out[ds] = {
      'n_questions': 30,
      'seed': 3,
      'pipelines': pipes,
      'per_question': [
        {'category': 'kind', 'scores': {p: {metric: float(s[i])} for p, s in per_q.items()}} for i in range(30)
      ],
    }
  fitted = {'tide_dense': {'train_sets': ['fc_sh_train'], 'chosen': f'tide_dense[recency={shift}]'}}
  return {'datasets': out, 'reference': {'tide_dense': {'fc_mh_6k answer@10': 0.40}}, 'fitted': fitted}


def test_tide_table_shows_a_missing_dataset_as_a_dash_and_compares_tide_with_dense():
  text = et.tide_tables({'a': _tide(0.3), 'b': _tide(0.3, datasets=('fc_sh_6k',))})
  assert '**longmemeval_s**, 30 questions:' in text and '**fc_sh_6k**, 30 questions:' in text
  lme_rows = [line for line in text.splitlines() if line.startswith('| `tide_dense` - `cosine`, ndcg_any@10 |')]
  assert len(lme_rows) == 1 and lme_rows[0].endswith(' | - |')  # b has no LongMemEval run
  sh = [line for line in text.splitlines() if line.startswith('| `tide_dense` - `cosine`, answer@1 |')]
  assert len(sh) == 1 and sh[0].count('*') == 2  # computed here in both columns
  assert 'LongMemEval_S by question type' in text
  assert '| `tide_dense` (on fc_sh_train) | `tide_dense[recency=0.3]` | `tide_dense[recency=0.3]` |' in text


def test_blocks_are_replaced_between_their_markers_only():
  page = 'x\n<!-- embedders-cfs: generated by ... -->\nold\n<!-- /embedders-cfs -->\ny\n'
  assert et.with_block(page, 'embedders-cfs', 'new\n') == page.replace('old\n', 'new\n')
  with pytest.raises(EngramError, match='no <!-- embedders-tide: generated -->'):
    et.with_block(page, 'embedders-tide', 'new\n')


def test_cfs_claims_are_checked_against_the_seed():
  seed = ('000_x.txt', 'adding CFS contributes +1.15 pp NDCG@10 and +1.79 pp Recall@10')
  assert et.check_claims(['+1.15 pp ndcg@10, +1.79 pp recall@10'], seed) == []
  assert et.check_claims(['+4.08 pp ndcg@10'], seed) == ['+4.08']


def test_headline_has_one_row_per_seed_row_and_the_published_column():
  r = _results(0.01)
  text = et.headline({'small': r, 'big': r})
  assert text.splitlines()[0] == '| LoCoMo ndcg@10 | small | big | published (text-embedding-3-small) |'
  stack = [line for line in text.splitlines() if line.startswith(f'| `{et.STACK}` |')]
  assert len(stack) == 1 and stack[0].endswith('| 0.5447 |')
  assert '`cosine`' not in text  # a row no run has is left out
