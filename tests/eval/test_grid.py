"""A grid of knob values in one call: any point equals a separate evaluate run (per-question scores and top-k ids),
legs are computed once per distinct value of their own knobs, static knobs group points by structure."""

import numpy as np
import pytest

from engram_jax.core.types import Episode, Item, Question
from engram_jax.eval import evaluation, grid, pipeline

WORDS = 'alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu'.split()
METRICS = ['ndcg@10', 'recall@5']


def _episodes(n_eps=3, seed=0, dim=8):
  rng = np.random.default_rng(seed)
  eps, embs = [], []
  for e in range(n_eps):
    n = int(rng.integers(40, 70))
    items = tuple(Item(f'e{e}i{j}', ' '.join(rng.choice(WORDS, 5)), f'p{j // 5}', j) for j in range(n))
    qs = tuple(
      Question(f'e{e}q{j}', ' '.join(rng.choice(WORDS, 3)), (f'e{e}i{int(g)}', f'e{e}i{int(g) // 2}'), (), 'c')
      for j, g in enumerate(rng.choice(n, 3 + e, replace=False))
    )
    eps.append(Episode(id=f'e{e}', items=items, questions=qs))
    d = rng.normal(size=(n, dim)).astype(np.float32)
    q = rng.normal(size=(len(qs), dim)).astype(np.float32)
    d[::7] = d[1::7][: len(d[::7])] if len(d[1::7]) >= len(d[::7]) else d[::7]  # some exact score ties
    embs.append((d / np.linalg.norm(d, axis=1, keepdims=True), q / np.linalg.norm(q, axis=1, keepdims=True)))
  return eps, embs


def _stack():
  return pipeline.make_pipeline(
    fusion='rrf',
    k0=60,
    name='stack',
    legs={
      'cos': {'op': 'cosine'},
      'bm25': {'op': 'bm25'},
      'cfsr': {'op': 'cfsr', 'depth': 20, 'weight': 3.0, 'pool': 30, 'iterations': 10},
    },
  )


GRID = {
  'legs.cos.weight': [0.5, 1, 2],
  'legs.bm25.weight': [0.0, 2.0],  # a zero weight: that leg's items tie at 0 with the unranked ones
  'k0': [20, 60],
  'legs.bm25.k1': [0.9, 1.5],
  'legs.cfsr.lam': [0.002, 0.02],
  'legs.cfsr.depth': [10, 20],
}


def _sample(n_points, rng, shape):
  """Corners of the grid (every knob at its first or last value) and random points."""
  corners = [0, n_points - 1]
  idx = np.arange(n_points).reshape(shape)
  corners.append(int(idx[(0,) * (len(shape) - 1) + (-1,)]))
  corners.append(int(idx[(-1,) + (0,) * (len(shape) - 1)]))
  return sorted(set(corners) | set(rng.choice(n_points, 4, replace=False).tolist()))


def assert_points_equal(res, want, sample, metrics) -> None:
  """Grid points ``sample`` of ``res`` equal the separate run ``want`` (pipelines ``p<point>``): per-question scores
  of every metric and top-k ids."""
  assert want.question_ids == res.question_ids
  for p in sample:
    for m in metrics:
      np.testing.assert_array_equal(res.scores[m][p], want.scores[f'p{p}'][m])
    assert res.retrieved[p] == want.retrieved[f'p{p}']


@pytest.mark.slow
def test_grid_points_equal_separate_runs():
  eps, embs = _episodes()
  pipe = _stack()
  shape = tuple(len(v) for v in GRID.values())
  n = int(np.prod(shape))
  sample = _sample(n, np.random.default_rng(0), shape)
  res = grid.evaluate_grid(eps, embs, pipe, GRID, k=10, metrics=METRICS, seed=3, chunk=5, keep_topk=sample)
  assert res.n_points == n == 96
  assert res.info['structures'] == 2  # legs.cfsr.depth is static: two structures
  # cos: one value of its own knobs; bm25: two k1; cfsr: two lam; per structure
  assert res.info['legs_computed'] == 2 * (1 + 2 + 2)
  assert not np.isnan(res.scores['ndcg@10']).any()
  pipes = {f'p{p}': pipeline.with_values(pipe, res.point(p), name=f'p{p}') for p in sample}
  for cache in (None, evaluation.legcache.LegCache()):
    want = evaluation.evaluate(eps, embs, pipes, k=10, metrics=METRICS, seed=3, progress=False, leg_cache=cache)
    assert_points_equal(res, want, sample, METRICS)


@pytest.mark.slow
def test_one_leg_pipeline_grid_equals_separate_runs():
  eps, embs = _episodes(seed=1)
  pipe = pipeline.make_pipeline(legs={'cfsr': {'op': 'cfsr', 'pool': 30, 'iterations': 10}}, name='alone')
  g = {'legs.cfsr.lam': [0.001, 0.01], 'legs.cfsr.w': [0.5, 1.0]}
  res = grid.evaluate_grid(eps, embs, pipe, g, k=10, metrics=METRICS, seed=5, keep_topk=range(4))
  pipes = {f'p{p}': pipeline.with_values(pipe, res.point(p), name=f'p{p}') for p in range(4)}
  want = evaluation.evaluate(eps, embs, pipes, k=10, metrics=METRICS, seed=5, progress=False)
  for p in range(4):
    np.testing.assert_array_equal(res.scores['ndcg@10'][p], want.scores[f'p{p}']['ndcg@10'])
    assert res.retrieved[p] == want.retrieved[f'p{p}']


CITIES = ['Paris', 'Rome', 'Oslo', 'Lima', 'Kyiv', 'Quito', 'Doha', 'Baku']


def _fc_episodes(n_eps=2, seed=0, dim=8):
  """FactConsolidation-like episodes: numbered facts ``<subject> lives in <city>.``, later facts overwrite earlier
  ones; a question asks for a subject's city, its gold the newest fact, its answer that city as a JSON list (as
  the loader stores it), so ``answer@k`` also counts a superseded fact naming the same city."""
  import json

  rng = np.random.default_rng(seed)
  eps, embs = [], []
  for e in range(n_eps):
    n = int(rng.integers(40, 60))
    subjects = rng.choice(WORDS, n)
    cities = rng.choice(CITIES, n)
    items = tuple(
      Item(f'e{e}f{j}', f'{j}. {s} lives in {c}.', f'p{j // 6}', j) for j, (s, c) in enumerate(zip(subjects, cities))
    )
    qs = []
    for j, s in enumerate(dict.fromkeys(subjects.tolist())):
      newest = max(i for i in range(n) if subjects[i] == s)
      qs.append(
        Question(f'e{e}q{j}', f'where does {s} live', (items[newest].id,), (), 'c', json.dumps([cities[newest]]))
      )
    eps.append(Episode(id=f'e{e}', items=items, questions=tuple(qs)))
    d = rng.normal(size=(n, dim)).astype(np.float32)
    q = rng.normal(size=(len(qs), dim)).astype(np.float32)
    embs.append((d / np.linalg.norm(d, axis=1, keepdims=True), q / np.linalg.norm(q, axis=1, keepdims=True)))
  return eps, embs


FC_METRICS = ['answer@1', 'answer@5', 'parent_recall@5', 'ndcg@10']  # the dataset's own metrics and a label one


@pytest.mark.parametrize(
  'legs,g',
  [
    # the shape of a tune: one leg, one traced knob (conf/pipeline/bm25_recency.yaml's tune grid)
    ({'tide': {'op': 'tide', 'base': 'bm25', 'pool': 20}}, {'legs.tide.recency': [0.0, 0.5, 2.0, 16.0]}),
    # a tune of one leg's knob in an RRF pipeline: one point per value of the leg, each fused as evaluate fuses it
    (
      {'cos': {'op': 'cosine'}, 'tide': {'op': 'tide', 'base': 'bm25', 'pool': 20, 'depth': 20}},
      {'legs.tide.recency': [0.0, 0.5, 4.0]},
    ),
    # a fused grid: leg knobs, weights and k0, the tide leg's recency its own knob (candidates, vmapped fusion)
    pytest.param(
      {'cos': {'op': 'cosine'}, 'tide': {'op': 'tide', 'base': 'bm25', 'pool': 20, 'depth': 20}},
      {'legs.cos.weight': [0.5, 2.0], 'legs.tide.recency': [0.0, 4.0], 'k0': [1, 60]},
      marks=pytest.mark.slow,
    ),
  ],
  ids=['tune', 'tune_rrf', 'fused'],
)
def test_dataset_metric_grid_equals_separate_runs(legs, g):
  """A grid point's dataset-owned metrics (FactConsolidation's answer@k, parent_recall@k), per question, equal a
  separate evaluate run at its values; each metric is called once per question and distinct top-k list."""
  from engram_jax.data import factconsolidation

  eps, embs = _fc_episodes()
  fns = dict(factconsolidation.METRICS)
  calls = []

  def counted(name):
    def fn(ep, q, ranked, k):
      calls.append((name, k, q.id, tuple(ranked)))
      return fns[name](ep, q, ranked, k)

    return fn

  pipe = pipeline.make_pipeline(legs=legs, fusion='rrf' if len(legs) > 1 else 'none', name='fc')
  shape = tuple(len(v) for v in g.values())
  n = int(np.prod(shape))
  sample = _sample(n, np.random.default_rng(1), shape) if n > 4 else list(range(n))
  episode_metrics = {m: counted(m) for m in fns}
  res = grid.evaluate_grid(
    eps, embs, pipe, g, k=10, metrics=FC_METRICS, seed=2, chunk=3, keep_topk=sample, episode_metrics=episode_metrics
  )
  assert len(calls) == len(set(calls))  # one call per question and distinct top-k list, over every chunk
  assert res.info['fused_alone'] == (n if len(legs) > 1 and n <= 3 else 0)
  assert not any(np.isnan(v).any() for v in res.scores.values())
  assert 0 < res.scores['answer@1'].mean() < res.scores['answer@5'].mean() < 1  # not a constant
  pipes = {f'p{p}': pipeline.with_values(pipe, res.point(p), name=f'p{p}') for p in sample}
  want = evaluation.evaluate(eps, embs, pipes, k=10, metrics=FC_METRICS, seed=2, progress=False, episode_metrics=fns)
  assert_points_equal(res, want, sample, FC_METRICS)


def test_dataset_metric_needs_its_function():
  eps, embs = _fc_episodes(n_eps=1)
  pipe = pipeline.make_pipeline(legs={'bm25': {'op': 'bm25'}}, name='b')
  with pytest.raises(ValueError, match='Unknown metric'):
    grid.evaluate_grid(eps, embs, pipe, {'legs.bm25.k1': [1.2]}, k=10, metrics=['answer@1'], seed=0)


def test_points_order_and_canonical_values():
  pipe = _stack()
  pts = grid.grid_points(pipe, {'legs.cos.weight': [1, 2], 'k0': [20, 60, 80]})
  assert pts['legs.cos.weight'].tolist() == [1.0, 1.0, 1.0, 2.0, 2.0, 2.0]
  assert pts['k0'].tolist() == [20.0, 60.0, 80.0] * 2
  assert pts['legs.cos.weight'].dtype == np.float64
  with pytest.raises(ValueError, match='no knob'):
    grid.grid_points(pipe, {'legs.cos.nope': [1]})


def test_flatten_grid_nested_and_flat():
  nested = {'legs': {'cos': {'weight': [1, 2]}, 'bm25': {'weight': [3]}}, 'k0': 20}
  assert grid.flatten_grid(nested) == {'legs.cos.weight': [1, 2], 'legs.bm25.weight': [3], 'k0': [20]}
  assert grid.flatten_grid({'legs.cos.weight': [1]}) == {'legs.cos.weight': [1]}
  with pytest.raises(ValueError, match='no values'):
    grid.flatten_grid({'k0': []})


def test_rank_points_plateau_and_npz_round_trip(tmp_path):
  rng = np.random.default_rng(0)
  q = 200
  base = rng.random(q)
  scores = np.stack([base, base - 0.001 * rng.random(q), base - 0.3, base + 0.0005 * rng.standard_normal(q)])
  res = grid.GridResult(
    pipeline='x',
    paths=['legs.a.weight', 'legs.b.weight'],
    points={'legs.a.weight': np.array([1.0, 1.0, 2.0, 2.0]), 'legs.b.weight': np.array([1.0, 2.0, 1.0, 2.0])},
    question_ids=[f'q{i}' for i in range(q)],
    episode_ids=['e'] * q,
    categories=[1] * q,
    scores={'ndcg@10': scores},
    retrieved={},
    k=10,
    info={},
  )
  ranked = grid.rank_points(res, 'ndcg@10', seed=1, n_resamples=2000)
  assert [r['point'] for r in ranked][-1] == 2
  assert ranked[0]['on_plateau'] and not ranked[-1]['on_plateau']
  assert ranked[-1]['params'] == {'legs.a.weight': 2.0, 'legs.b.weight': 1.0}
  grid.save_npz(res, tmp_path / 'grid.npz')
  back = grid.load_npz(tmp_path / 'grid.npz')
  assert back.paths == res.paths and back.question_ids == res.question_ids
  np.testing.assert_array_equal(back.scores['ndcg@10'], scores)
  np.testing.assert_array_equal(back.points['legs.b.weight'], res.points['legs.b.weight'])


@pytest.mark.parametrize('workers', [1, 2])
def test_rank_points_equals_separate_paired_tests(monkeypatch, workers):
  """Intervals and paired deltas from one draw per batch of rows: the numbers of separate calls, on one thread or
  two; the default tests batches of leading points until one holds no point on the plateau."""
  from engram_jax.metrics import stats

  monkeypatch.setattr(stats, 'workers', lambda: workers)
  rng = np.random.default_rng(2)
  scores = rng.random((5, 300))
  scores[1] = scores[0] + 0.01 * rng.standard_normal(300)
  scores[2:] = scores[0] - 0.3 - 0.01 * np.arange(3)[:, None]
  res = grid.GridResult(
    'x',
    ['k0'],
    {'k0': np.arange(5.0)},
    [f'q{i}' for i in range(300)],
    ['e'] * 300,
    [1] * 300,
    {'m@1': scores},
    {},
    1,
    {},
  )
  full = grid.rank_points(res, 'm@1', seed=4, n_resamples=500, top=5)
  adaptive = grid.rank_points(res, 'm@1', seed=4, n_resamples=500, batch=2)
  assert len(adaptive) == 4 and adaptive == full[:4]
  alone = res.scores['m@1'].copy()
  alone[1] -= 0.3  # only the best on the plateau: the first batch is enough
  res.scores['m@1'] = alone
  assert len(grid.rank_points(res, 'm@1', seed=4, n_resamples=500, batch=2)) == 2
  res.scores['m@1'] = scores
  assert [r['on_plateau'] for r in full] == [True, True, False, False, False]
  best = scores[full[0]['point']]
  for r in full:
    ci = stats.bootstrap_ci(scores[r['point']], seed=4, n_resamples=500)
    assert r['ci'] == [ci.lo, ci.hi]
    if r['rank'] > 1:
      assert r['vs_best'] == stats.paired_test(scores[r['point']], best, seed=4, n_resamples=500).to_dict()


@pytest.mark.parametrize('seed', range(4))
def test_candidate_fusion_equals_rrf_fusion(seed):
  """The grid's fusion over candidates equals evaluate's (rrf_from_top + top-k over every item) on random legs with
  shallow depths, unranked slots, zero weights and many ties, where fewer than k items score above 0."""
  import jax.numpy as jnp

  from engram_jax.eval import legcache

  rng = np.random.default_rng(seed)
  e, q, n, k = 3, 5, 120, 10
  where = np.ones((e, n), bool)
  where[1, 90:] = False  # a shorter episode
  depths = [3, 4, 2]
  tops = []
  for d in depths:
    s = np.round(rng.normal(size=(e, q, n)), 0).astype(np.float32)
    s[:, :, rng.random(n) < 0.98] = -np.inf  # most items unranked: slots past the ranked ones are unranked
    tops.append(legcache.leg_top(jnp.asarray(s), jnp.asarray(where)[:, None, :], d))
  idx = [np.asarray(t[0]) for t in tops]
  ranked = [np.asarray(t[1]) for t in tops]
  weights = np.array([[1.0, 0.0, 2.0], [0.0, 0.0, 0.0], [0.5, 1.0, 3.0], [1.0, 1.0, 1.0]], np.float32)
  k0 = np.array([60.0, 20.0, 1.0, 1.0], np.float32)
  want = [
    np.asarray(evaluation.stacked_fusion(k)(idx, ranked, jnp.asarray(where), list(w), np.float32(z)))
    for w, z in zip(weights, k0)
  ]
  cand, ranks = grid.grid_candidates(k)(idx, ranked, jnp.asarray(where))
  got = np.asarray(grid.grid_fusion(k)(cand, ranks, weights, k0))
  for j in range(len(weights)):
    np.testing.assert_array_equal(got[j], want[j])


def test_gains_give_every_label_metric_exactly():
  """The compact (positions, gains + missed gold) form gives every label metric the floats of (top-k, labels)."""
  from engram_jax.metrics import labels as metrics_lib

  rng = np.random.default_rng(0)
  b, e, q, n, k = 4, 3, 7, 30, 10
  labels = rng.random((e, q, n)) < 0.1
  labels[0, 0] = False  # a question without gold
  tops = np.stack([rng.permutation(n)[:k] for _ in range(b * e * q)]).reshape(b, e, q, k).astype(np.int32)
  tops[1, 1, 1, 7:] = -1  # empty slots
  pos, gold = grid.as_gains(tops, labels.reshape(-1), labels.sum(-1))
  for name, fn in metrics_lib.METRICS.items():
    for cut in (1, 5, 10):
      np.testing.assert_array_equal(
        fn(pos, gold, k=cut), fn(tops, np.broadcast_to(labels, tops.shape[:3] + (n,)), k=cut)
      )


SHARDED = """
import json, sys
import jax, numpy as np
sys.path.insert(0, 'tests/eval')
from test_grid import GRID, _episodes, _stack
from engram_jax.eval import grid

assert jax.device_count() == 4, jax.devices()
eps, embs = _episodes()
out = {}
for devices in (1, 4):
  r = grid.evaluate_grid(eps, embs, _stack(), GRID, k=10, metrics=['ndcg@10'], seed=3, chunk=6, devices=devices,
                         keep_topk=[0, 95])
  out[devices] = {'scores': r.scores['ndcg@10'].tolist(), 'top': r.retrieved, 'devices': r.info['devices']}
print('RESULT ' + json.dumps(out))
"""


@pytest.mark.slow
def test_grid_sharded_over_points_equals_one_device():
  from run_script import script_result

  out = script_result(SHARDED, fake_devices=4, timeout=600)
  assert out['4']['devices'] == 4 and out['1']['devices'] == 1
  assert out['4']['scores'] == out['1']['scores'] and out['4']['top'] == out['1']['top']
