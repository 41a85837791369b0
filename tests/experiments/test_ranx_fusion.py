"""experiments.research.ranx_fusion: its pure pieces (runs as dicts, folds, the fusion applied, the metrics, the docs
markers) without ranx; ranx itself (the peers extra, not installed by CI) only where it is installed."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from engram_jax.core import ranking
from engram_jax.core.errors import EngramError
from engram_jax.metrics import labels
from engram_jax.ops import rrf
from experiments.research import ranx_fusion as rf


def _legs(seed: int, n_q: int = 6, n: int = 30, depths=(5, 5, 12)):
  """Random leg scores [L, Q, N] with ties and unranked (-inf) items, their top-depth as run dicts."""
  rng = np.random.default_rng(seed)
  scores = np.round(rng.normal(size=(len(depths), n_q, n)), 1).astype(np.float32)  # rounding: ties
  scores[2, :, : n // 2] = -np.inf  # the third leg ranks only half the items
  qids = [f'q{i}' for i in range(n_q)]
  items = [f'd{j}' for j in range(n)]
  runs = []
  for s, d in zip(scores, depths):
    idx, vals = ranking.top_k(jnp.asarray(s), k=d, where=jnp.isfinite(jnp.asarray(s)))
    runs.append(rf.run_dict(qids, items, np.asarray(idx), np.asarray(vals)))
  return scores, qids, items, runs


def test_run_dict_keeps_rank_order_and_drops_unranked():
  got = rf.run_dict(['a', 'b'], ['x', 'y', 'z'], np.array([[1, 2], [0, 1]]), np.array([[0.3, -np.inf], [2.0, 1.0]]))
  assert got == {'a': {'y': 0.3}, 'b': {'x': 2.0, 'y': 1.0}}
  assert list(got['b']) == ['x', 'y']
  with pytest.raises(ValueError, match='shapes'):
    rf.run_dict(['a'], ['x'], np.zeros((2, 1), int), np.zeros((2, 1)))


def test_folds_split_questions_by_episode():
  episode_of = {'q1': 'e1', 'q2': 'e2', 'q3': 'e1', 'q4': 'e3'}
  train, held = rf.fold_qids(episode_of, ['e1', 'e3'])
  assert (train, held) == (['q2'], ['q1', 'q3', 'q4'])
  run = {q: {'d': 1.0} for q in episode_of}
  assert list(rf.subset(run, held)) == held
  with pytest.raises(KeyError, match='1 question ids'):
    rf.subset(run, ['q9'])
  with pytest.raises(EngramError, match='0 training'):
    rf.fold_qids(episode_of, ['e1', 'e2', 'e3'])
  assert rf.qrels_dict(['q1'], [('a', 'b')]) == {'q1': {'a': 1, 'b': 1}}


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_fusion_of_the_exported_lists_equals_rrf_fuse(seed):
  """Weighted RRF over the run dicts, ties to the later item, is the library's fused top-k (the script's export
  check relies on it)."""
  scores, qids, items, runs = _legs(seed)
  weights, k0, k = [0.4, 2.8, 1.9], 2.5, 8
  fused = rrf.rrf_fuse(jnp.asarray(scores), weights=jnp.asarray(weights), depths=[5, 5, 12], k0=k0)
  want, _ = ranking.top_k(fused, k=k)
  position = {d: j for j, d in enumerate(items)}
  for i, q in enumerate(qids):
    got = rf.ranked(rf.weighted_rrf([r[q] for r in runs], weights, k0), position, k)
    # items no leg ranks score 0 in rrf_fuse; the script's lists hold only ranked items (>= k of them here)
    assert got == [items[j] for j in np.asarray(want[i])], q


def test_label_scores_are_the_project_metrics():
  rng = np.random.default_rng(3)
  items = [f'd{j}' for j in range(20)]
  gold = [tuple(rng.choice(items, size=int(rng.integers(1, 4)), replace=False)) for _ in range(5)]
  top = [list(rng.permutation(items)[:10]) for _ in range(5)]
  got = rf.label_scores(top, gold, items, k=10)
  at = {d: j for j, d in enumerate(items)}
  topk = np.asarray([[at[d] for d in row] for row in top])
  lab = np.zeros((5, 20), bool)
  for i, g in enumerate(gold):
    lab[i, [at[d] for d in g]] = True
  np.testing.assert_array_equal(got['ndcg@10'], labels.ndcg_at_k(topk, lab, k=10))
  np.testing.assert_array_equal(got['recall@10'], labels.recall_at_k(topk, lab, k=10))
  assert got['recall@10'].max() > 0  # the draw finds some gold (the check is not vacuous)


def test_replace_between_markers():
  page = f'# T\n\n{rf.BEGIN}\nold table\n{rf.END}\nafter\n'
  new = rf.replace_between(page, 'new table\n')
  assert new == f'# T\n\n{rf.BEGIN}\nnew table\n{rf.END}\nafter\n'
  assert rf.replace_between(new, 'new table\n') == new
  with pytest.raises(EngramError, match='markers'):
    rf.replace_between('no markers', 'x')


@pytest.mark.parametrize(
  'argv, match',
  [
    (['--n-resamples', '0'], 'n-resamples 0'),
    (['--docs', '{tmp}/absent.md'], 'no such file'),
    (['--docs', '{tmp}/page.md'], 'markers'),
    (['--render'], 'results.json not found'),
    (['--fit-run', '{tmp}/absent'], 'no such folder'),
  ],
)
def test_bad_arguments_refused_before_any_work(tmp_path, capsys, argv, match):
  """Each mistake is one line (exit 1) before the fit or any loading starts: nothing is written into OUT."""
  from experiments.lib import common

  (tmp_path / 'page.md').write_text('# a page without the markers\n')
  out = tmp_path / 'out'
  with pytest.raises(SystemExit) as e:
    common.plain_errors(rf.main)(['--out', str(out), *[a.format(tmp=tmp_path) for a in argv]])
  assert e.value.code == 1
  err = capsys.readouterr().err.strip()
  assert match in err and '\n' not in err
  assert not out.exists()


@pytest.mark.slow  # numba compiles ranx's kernels on a first call
def test_ranx_fuses_and_scores_as_the_script_reads_it():
  """ranx's rrf of the run dicts is our unweighted RRF at k0 = k (same order where scores differ), and ranx's ndcg@10
  of a run equals the project's on the same ranked lists."""
  ranx = pytest.importorskip('ranx')
  _, qids, items, runs = _legs(4)
  fused = ranx.fuse([ranx.Run.from_dict(r) for r in runs], norm=None, method='rrf', params={'k': 10})
  fused.sort()
  got = fused.to_dict()
  position = {d: j for j, d in enumerate(items)}
  for q in qids:
    ours = rf.weighted_rrf([r[q] for r in runs], [1.0, 1.0, 1.0], 10.0)
    assert set(got[q]) == set(ours)
    np.testing.assert_allclose([got[q][d] for d in ours], list(ours.values()), rtol=1e-12)
    distinct = len(set(ours.values())) == len(ours)
    if distinct:
      assert list(got[q]) == rf.ranked(ours, position, len(ours))
  gold = [(items[0], items[-1]), (items[3],), (items[-2], items[5], items[7]), (items[1],), (items[-1],), (items[9],)]
  qrels = ranx.Qrels.from_dict(rf.qrels_dict(qids, gold))
  ranx.evaluate(qrels, fused, ['ndcg@10', 'recall@10'], save_results_in_run=True)
  mine = rf.label_scores([list(got[q]) for q in qids], gold, items, k=10)
  for m in ('ndcg@10', 'recall@10'):
    np.testing.assert_allclose([fused.scores[m][q] for q in qids], mine[m], rtol=0, atol=1e-12)
  assert max(mine['recall@10']) > 0
  jax.clear_caches()
