"""Gradient fitting: planted knobs recovered, soft pipeline == hard when cold, one compilation, disjoint splits."""

import functools
import json
import logging
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hydra import compose, initialize_config_dir

from engram_jax import fit
from engram_jax.core import batch
from engram_jax.core.types import Episode, Item, Question
from engram_jax.data import io
from engram_jax.eval import evaluation
from engram_jax.eval import pipeline as P
from engram_jax.fit.folds import DEFAULT_SEED
from engram_jax.ops import bm25 as bm25_ops

WORDS = [f'w{i}' for i in range(40)]
COLD = fit.Temperatures(rank=1e-7, depth=1e-7, greedy=1e-7, final=1e-7, cutoff=1e-7)
CONF = str(Path(__file__).resolve().parents[2] / 'conf')
try:
  HAVE = (io.resolve_data_root() / 'locomo' / 'locomo10.json').is_file()
except FileNotFoundError:
  HAVE = False


def small_fit_cfg(tmp_path, *extra: str):
  """The ``fit`` config of a two-step, two-fold fit of ``rrf_cos_bm25`` on two LoCoMo conversations with the hashing
  embedder (the end-to-end fit tests here and in test_adapter / test_conditioned), plus ``extra`` overrides."""
  with initialize_config_dir(config_dir=CONF, version_base='1.3'):
    return compose(
      config_name='fit',
      overrides=[
        'embedder=hashing',
        'dataset.loader.conversations=[conv-30,conv-26]',
        'pipeline=rrf_cos_bm25',
        'fit.folds=2',
        'fit.steps=2',
        'fit.batch_size=16',
        'eval.n_resamples=100',
        'eval.progress=false',
        'fit.baselines=[cosine]',
        f'paths.cache_dir={tmp_path}/cache',
        *extra,
      ],
    )


def _episodes(n_eps=2, n=60, q=48, d=16, seed=0, gold=None):
  """Synthetic episodes (random unit embeddings, random word texts); ``gold(e) -> [q] item indices``."""
  rng = np.random.default_rng(seed)
  eps, embs = [], []
  for e in range(n_eps):
    items = tuple(Item(id=f'e{e}i{i}', text=' '.join(rng.choice(WORDS, 8)), parent='s', position=i) for i in range(n))
    g = np.zeros(q, int) if gold is None else gold(e)
    qs = tuple(
      Question(
        id=f'e{e}q{j}', text=' '.join(rng.choice(WORDS, 4)), gold=(f'e{e}i{g[j]}',), gold_parents=('s',), category=1
      )
      for j in range(q)
    )
    docs = rng.normal(size=(n, d))
    queries = rng.normal(size=(q, d))
    embs.append(
      (docs / np.linalg.norm(docs, axis=1, keepdims=True), queries / np.linalg.norm(queries, axis=1, keepdims=True))
    )
    eps.append(Episode(id=f'e{e}', items=items, questions=qs))
  return eps, embs


def _planted(pipe, **kw):
  """Episodes whose gold item is the planted pipeline's hard top-1 (as a 1-element list)."""
  eps, embs = _episodes(**kw)
  top1 = [
    np.asarray(P.pipeline_topk(pipe, batch.episode_arrays(e, *x), jax.random.key(0), k=1))[:, 0]
    for e, x in zip(eps, embs)
  ]
  eps, embs = _episodes(gold=lambda e: top1[e], **kw)
  return eps, embs, [batch.episode_arrays(e, *x) for e, x in zip(eps, embs)]


def _ndcg(pipe, eps, embs, arrays):
  r = evaluation.evaluate(eps, embs, {'p': pipe}, k=10, metrics=['ndcg@10'], seed=0, progress=False, arrays=arrays)
  return float(r.scores['p']['ndcg@10'].mean())


def _tide(recency):
  return P.make_pipeline(legs={'tide': {'op': 'tide', 'base': 'cosine', 'pool': 30, 'recency': recency}}, name='tide')


def _rrf(*legs, weights):
  """An RRF pipeline of ``(leg name, leg node, depth)`` legs with these weights."""
  return P.make_pipeline(
    legs={n: {**node, 'depth': d, 'weight': w} for (n, node, d), w in zip(legs, weights)}, fusion='rrf', name='rrf'
  )


COS, BM25 = ('cos', {'op': 'cosine'}, 10), ('bm25', {'op': 'bm25'}, 10)


def test_fit_recovers_a_planted_tide_weight():
  eps, embs, arrays = _planted(_tide(0.3), n_eps=2, n=60, q=48)
  start = _tide(0.0)
  problem, knobs, every = fit.make_problem(start, ['legs.tide.recency'])
  rows = fit.build_rows(problem, start, eps, arrays, seed=DEFAULT_SEED)
  res = fit.fit(problem, knobs, every, rows, np.arange(96), fit.Schedule(optax.adam(0.05), steps=60, batch_size=64))
  assert 0.2 < res.values['legs.tide.recency'] < 0.45, res.values
  assert np.mean(res.losses[-10:]) < np.mean(res.losses[:5])
  assert _ndcg(P.with_values(start, res.values), eps, embs, arrays) > _ndcg(start, eps, embs, arrays) + 0.2


@pytest.mark.slow
def test_fit_recovers_planted_rrf_weights():
  eps, embs, arrays = _planted(_rrf(COS, BM25, weights=[0.3, 1.7]), n_eps=2, n=60, q=48)
  start = _rrf(COS, BM25, weights=[1.0, 1.0])
  problem, knobs, every = fit.make_problem(start, ['legs.cos.weight', 'legs.bm25.weight'])
  assert problem.normalise_weights
  rows = fit.build_rows(problem, start, eps, arrays, seed=DEFAULT_SEED)
  res = fit.fit(problem, knobs, every, rows, np.arange(96), fit.Schedule(optax.adam(0.1), steps=25, batch_size=64))
  w = res.values
  # planted 1.7 / 0.3; a range of ratios gives the same top-1
  assert w['legs.bm25.weight'] / w['legs.cos.weight'] > 1.5, w
  np.testing.assert_allclose(w['legs.cos.weight'] + w['legs.bm25.weight'], 2.0, rtol=1e-5)  # mean kept at 1
  assert _ndcg(P.with_values(start, w), eps, embs, arrays) > _ndcg(start, eps, embs, arrays)


# cfsr, cfs and mmr: slow tier (heavy compiles); the fast tier checks their twins on batched rows through
# test_registry_twins (engram_jax.testing.check_operator)
@pytest.mark.parametrize(
  'case', [pytest.param(c, marks=pytest.mark.slow) for c in ('cfsr', 'cfs', 'mmr')] + ['bm25', 'tide']
)
def test_soft_pipeline_is_the_hard_one_when_cold(case):
  eps, embs = _episodes(n_eps=2, n=40, q=6, seed=3)
  arrays = [batch.episode_arrays(e, *x) for e, x in zip(eps, embs)]
  if case == 'cfsr':
    pipe = _rrf(COS, BM25, ('cfsr', {'op': 'cfsr', 'pool': 20, 'iterations': 10}, 15), weights=[1.0, 0.7, 2.0])
    params = ['legs.cfsr.lam', 'legs.cfsr.w', 'legs.cos.weight', 'k0']
  elif case in ('cfs', 'mmr'):
    pipe = _rrf(COS, BM25, (case, {'op': case, 'k': 6}, 5), weights=[1.0, 0.7, 2.0])
    params = ['legs.cfs.beta', 'legs.cfs.sigma'] if case == 'cfs' else ['legs.mmr.lam']
  elif case == 'bm25':
    pipe = P.make_pipeline(legs={'bm25': {'op': 'bm25', 'k1': 1.1, 'b': 0.6}})
    params = ['legs.bm25.k1', 'legs.bm25.b']
  else:
    pipe = _tide(0.2)
    params = ['legs.tide.recency']
  problem, knobs, every = fit.make_problem(
    pipe, params, temperatures=COLD, settings=fit.Settings(greedy_pool=64, candidates=30)
  )
  rows = fit.build_rows(problem, pipe, eps, arrays, seed=DEFAULT_SEED)
  vals = fit.effective_values(problem, knobs.raw, every)
  soft = np.asarray(jax.jit(functools.partial(fit.soft_scores, problem))(vals, rows))
  hard_fn = jax.jit(functools.partial(P.pipeline_scores, pipe))
  hard = np.concatenate([np.asarray(hard_fn(a, jax.random.key(0)))[:6] for a in arrays])
  np.testing.assert_array_equal(np.isfinite(soft), np.isfinite(hard))
  np.testing.assert_allclose(soft[np.isfinite(soft)], hard[np.isfinite(hard)], rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # the fast tier checks BM25 against rank_bm25 (tests/ops/test_bm25.py)
def test_bm25_term_statistics_equal_bm25_scores():
  eps, embs = _episodes(n_eps=1, n=30, q=5, seed=4)
  arr = batch.episode_arrays(eps[0], *embs[0])
  pipe = P.make_pipeline(legs={'bm25': {'op': 'bm25'}})
  problem, _, _ = fit.make_problem(pipe, ['legs.bm25.k1', 'legs.bm25.b'])
  rows = fit.build_rows(problem, pipe, eps, [arr], seed=DEFAULT_SEED)
  stats = rows.legs[0]  # the BM25 soft twin's rows: per-question term statistics
  for k1, b in ((1.5, 0.75), (0.4, 0.1), (2.5, 1.0)):
    got = bm25_ops.bm25_from_stats(stats['tf'], stats['w'], stats['dlr'], k1=k1, b=b)[:, :30]
    want = bm25_ops.bm25_sparse_scores(arr.lexicons['words'], where=arr.where, k1=k1, b=b)[:5, :30]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_step_does_not_recompile(caplog):
  eps, embs = _episodes(n_eps=1, n=40, q=8, seed=5)
  arrays = [batch.episode_arrays(e, *x) for e, x in zip(eps, embs)]
  pipe = _rrf(COS, BM25, weights=[1.0, 1.0])
  problem, knobs, every = fit.make_problem(pipe, ['legs.cos.weight', 'legs.bm25.weight', 'k0'])
  rows = fit.build_rows(problem, pipe, eps, arrays, seed=DEFAULT_SEED)
  opt = fit.group_optimizer(optax.adam(0.1))
  step = fit.make_step(problem, opt, max_gold=4)
  fixed = {p: jnp.asarray(v, jnp.float32) for p, v in every.items()}
  params = {'knobs': dict(knobs.raw)}
  state = fit.TrainState(params=params, opt_state=opt.init(params), step=jnp.zeros((), jnp.int32))
  state, _ = step(state, fixed, rows, {}, jnp.arange(4), jnp.ones(4), jnp.float32(1.0))
  fixed['legs.bm25.k1'] = jnp.asarray(0.9, jnp.float32)  # another value of a traced knob
  idx, weight = jnp.arange(4, 8), jnp.array([1.0, 1.0, 0.0, 1.0])  # another batch
  with jax.log_compiles(True), caplog.at_level(logging.WARNING):
    caplog.clear()
    state, loss = step(state, fixed, rows, {}, idx, weight, jnp.float32(0.3))  # another temperature factor
  assert step._cache_size() == 1
  assert not [r for r in caplog.records if 'Compiling' in r.getMessage()], [r.getMessage() for r in caplog.records]
  assert int(state.step) == 2 and np.isfinite(float(loss))


@pytest.mark.slow  # two fits; the fast tier keeps the planted-weight fit
def test_annealing_schedule_and_the_gap_monitor():
  assert fit.anneal_scale(0, 10) == 1.0 and fit.anneal_scale(9, 10) == 1.0
  np.testing.assert_allclose([fit.anneal_scale(t, 3, (1.0, 0.25)) for t in range(3)], [1.0, 0.5, 0.25])
  with pytest.raises(ValueError, match='> 0'):
    fit.anneal_scale(0, 10, (1.0, 0.0))
  eps, embs, arrays = _planted(_tide(0.3), n_eps=2, n=60, q=48)
  start = _tide(0.0)
  problem, knobs, every = fit.make_problem(start, ['legs.tide.recency'])
  rows = fit.build_rows(problem, start, eps, arrays, seed=DEFAULT_SEED)
  soft_eval = fit.make_soft_eval(problem, max_gold=4)
  seen = []

  def monitor(step, scale, vals):
    soft = fit.soft_ndcg_rows(soft_eval, vals, rows, np.arange(96), scale=scale, batch_size=40)
    hard = _ndcg(P.with_values(start, {'legs.tide.recency': float(vals['legs.tide.recency'])}), eps, embs, arrays)
    seen.append(step)
    return {'soft_ndcg': float(soft.mean()), 'hard_ndcg': hard}

  kw = dict(optimizer=optax.adam(0.05), steps=20, batch_size=64)
  plain = fit.fit(problem, knobs, every, rows, np.arange(96), fit.Schedule(**kw))
  watched = fit.fit(
    problem, knobs, every, rows, np.arange(96), fit.Schedule(**kw, monitor_steps=(0, 10, 20)), monitor=monitor
  )
  assert seen == [0, 10, 20] and [m['step'] for m in watched.monitor] == [0, 10, 20]
  assert watched.values == plain.values and watched.losses == plain.losses  # watching never changes a fit
  assert watched.scales == [1.0] * 20
  # the soft twin's approx-NDCG, cooled, is the hard NDCG at the same knobs (the gap closes as T -> 0)
  vals = fit.effective_values(problem, knobs.raw, every)
  hard = _ndcg(start, eps, embs, arrays)
  gaps = [
    abs(float(fit.soft_ndcg_rows(soft_eval, vals, rows, np.arange(96), scale=t, batch_size=40).mean()) - hard)
    for t in (1.0, 1e-2, 1e-6)
  ]
  assert gaps[2] < 1e-3 and gaps[2] <= gaps[0], gaps
  annealed = fit.fit(problem, knobs, every, rows, np.arange(96), fit.Schedule(**kw, anneal=(1.0, 0.1)))
  assert annealed.scales[0] == 1.0
  np.testing.assert_allclose(annealed.scales[-1], 0.1)
  assert annealed.losses != plain.losses


def test_soft_ndcg_of_some_rows_equals_those_rows_scored_with_every_row():
  # experiments.fit.gap_monitor scores every question once at step 0 and each fold averages its training rows
  pipe = P.make_pipeline(
    legs={'cos': {'op': 'cosine'}, 'bm25': {'op': 'bm25'}, 'cfsr': {'op': 'cfsr', 'pool': 20, 'depth': 15}},
    fusion='rrf',
    name='stack',
  )
  eps, embs, arrays = _planted(pipe, n_eps=2, n=60, q=48)
  problem, knobs, every = fit.make_problem(pipe, ['legs.cfsr.lam', 'legs.bm25.k1', 'k0'])
  rows = fit.build_rows(problem, pipe, eps, arrays, seed=DEFAULT_SEED)
  soft_eval = fit.make_soft_eval(problem, max_gold=4)
  vals = fit.effective_values(problem, knobs.raw, every)
  every_row = fit.soft_ndcg_rows(soft_eval, vals, rows, np.arange(96), scale=1.0, batch_size=32)
  for seed in (0, 1):
    some = np.random.default_rng(seed).permutation(96)[:57]
    got = fit.soft_ndcg_rows(soft_eval, vals, rows, some, scale=1.0, batch_size=32)
    np.testing.assert_array_equal(got, every_row[some])


def test_splits_are_seeded_and_disjoint_and_the_assertion_fires():
  ids = [f'conv-{i}' for i in range(10)]
  folds = fit.episode_folds(ids, n_folds=10, seed=20261008)
  assert sorted(f[0] for f in folds) == sorted(ids) and all(len(f) == 1 for f in folds)
  assert folds == fit.episode_folds(ids, n_folds=10, seed=20261008) != fit.episode_folds(ids, n_folds=10, seed=1)
  five = fit.episode_folds(ids, n_folds=5)
  assert sorted(sum(five, [])) == sorted(ids) and {len(f) for f in five} == {2}
  train, test = fit.holdout_split(ids, n_test=3)
  assert len(test) == 3 and not set(train) & set(test) and len(train) == 7
  qids = ['a', 'b', 'c', 'd']
  fit.check_disjoint(qids, np.array([0, 1]), np.array([2, 3]))
  with pytest.raises(ValueError, match='overlap the scored ids: b'):
    fit.check_disjoint(qids, np.array([0, 1]), np.array([1, 2]))
  # a question id shared by two episodes: cross-fitting refuses to train on a scored question
  eps, embs = _episodes(n_eps=2, n=30, q=4, seed=6)
  arrays = [batch.episode_arrays(e, *x) for e, x in zip(eps, embs)]
  pipe = _tide(0.1)
  problem, knobs, every = fit.make_problem(pipe, ['legs.tide.recency'])
  rows = fit.build_rows(problem, pipe, eps, arrays, seed=DEFAULT_SEED)
  qids = [q.id for e in eps for q in e.questions]
  qids[5] = qids[0]
  with pytest.raises(ValueError, match='overlap the scored ids'):
    fit.crossfit(
      problem,
      knobs,
      every,
      rows,
      fit.Folds(['e0'] * 4 + ['e1'] * 4, qids, [['e0'], ['e1']]),
      fit.Schedule(optax.adam(0.1), steps=1, batch_size=4),
    )


def test_unknown_knobs_are_clear_errors():
  pipe = _rrf(COS, BM25, weights=[1.0, 1.0])
  with pytest.raises(ValueError, match="no leg 'nope'"):
    fit.make_problem(pipe, ['legs.nope.weight'])
  with pytest.raises(ValueError, match='no knob'):
    fit.make_problem(pipe, ['legs.bm25.nope'])
  with pytest.raises(ValueError, match="knob paths are 'k0' or 'legs.<leg>.<knob>'"):
    fit.make_problem(pipe, ['legs.1.score.k1'])  # the old positional form
  with pytest.raises(ValueError, match='cannot fit'):
    fit.make_problem(pipe, ['legs.bm25.epsilon'])
  with pytest.raises(ValueError, match='no fusion'):
    fit.make_problem(_tide(0.1), ['k0'])


@pytest.mark.slow
@pytest.mark.skipif(not HAVE, reason='LoCoMo not found under the data root')
def test_experiment_writes_fitted_json(tmp_path):
  from experiments import fit as fit_exp

  cfg = small_fit_cfg(tmp_path)
  res = fit_exp.run(cfg, tmp_path / 'out')
  fitted = json.loads((tmp_path / 'out' / 'fitted.json').read_text())
  assert fitted['pipeline'] == 'rrf_cos_bm25' and sorted(fitted['folds']) == ['conv-26', 'conv-30']
  assert set(fitted['folds']['conv-30']) == {'legs.cos.weight', 'legs.bm25.weight', 'k0'}
  split = json.loads((tmp_path / 'out' / 'split.json').read_text())
  assert split['seed'] == 20261008 and len(split['folds']) == 2
  for f in split['folds']:
    assert not set(f['scored_episodes']) & set(f['train_episodes'])
  assert res['n_questions'] == 105 + 197
  assert len(json.loads((tmp_path / 'out' / 'loss_curve.json').read_text())['conv-30']) == 2
  # the soft-vs-hard gap at the start and end of each fold's fit (gap_checks 4 of 2 steps: steps 0, 1, 2)
  gap = res['soft_hard_gap']
  assert [r['step'] for r in gap['by_step']] == [0, 1, 2] and len(gap['per_fold']) == 2
  for r in gap['by_step']:
    assert 0.0 <= r['soft_ndcg'] <= 1.0 and 0.0 <= r['hard_ndcg'] <= 1.0
    assert abs(r['gap'] - (r['soft_ndcg'] - r['hard_ndcg'])) < 1e-12
  # per-category paired tests on the same questions, for the hand-set pipeline and each baseline
  cats = res['per_question']['categories']
  for c, v in res['by_category'].items():
    assert v['n'] == cats.count(c) >= 10 and set(v['paired']) == {'rrf_cos_bm25', 'cosine'}
    sel = [i for i, x in enumerate(cats) if x == c]
    want = np.mean(np.asarray(res['per_question']['fitted']['ndcg@10'])[sel])
    assert abs(v['fitted']['ndcg@10'] - want) < 1e-12


def test_search_config_composes_and_flattens():
  from experiments.lib import common
  from experiments.research import search_compare

  with initialize_config_dir(config_dir=CONF, version_base='1.3'):
    cfg = compose(config_name='fit_search', overrides=['values.k0=30', '+values.legs.cos.weight=0.5'])
  assert cfg.fit.split == 'holdout' and list(cfg.pipeline) == ['rrf_cos_bm25']
  assert search_compare.flat_values(cfg['values']) == {'legs.bm25.weight': 1.0, 'k0': 30.0, 'legs.cos.weight': 0.5}
  pipe = P.with_values(common.hand_set_pipeline('rrf_cos_bm25'), search_compare.flat_values(cfg['values']))
  assert pipe.k0 == 30.0 and pipe.leg('cos').weight == 0.5 and pipe.leg('bm25').weight == 1.0
