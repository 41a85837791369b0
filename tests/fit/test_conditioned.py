"""Question-conditioned fusion knobs: a constant module gives exactly the scalar path (soft and hard), gradients
reach the module, per-question values differ after a fit on a planted per-question rule, config errors are clear."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_fit import BM25, COS, _episodes, _rrf

from engram_jax import fit
from engram_jax.core import batch, ranking
from engram_jax.eval import evaluation
from engram_jax.eval import pipeline as P
from engram_jax.fit import components
from engram_jax.fit import conditioned as C
from engram_jax.fit.folds import DEFAULT_SEED

KNOBS = ('legs.cos.weight', 'legs.bm25.weight', 'k0')
SPEC = C.Conditioning(knobs=KNOBS, features=('cues', 'pool', 'query'), hidden=0, rank=4, net_lr_scale=1.0)


def _hard_topk(pipe, problem, spec, res, fixed, ep, feats, query, key, *, k):
  """Top-``k`` ``[Q, k]`` of the hard pipeline with one conditioned component (the registry's hard scores)."""
  fused = components.hard_scores(pipe, problem, (spec,), res, fixed, ep, {spec.name: (feats, query)}, key)
  idx, v = ranking.top_k(fused, k=k, where=ep.where)
  return jnp.where(jnp.isneginf(v), -1, idx)


def _setup(spec=SPEC, weights=(1.0, 1.0)):
  eps, embs = _episodes(n_eps=2, n=60, q=24, d=16, seed=3, gold=lambda e: np.arange(24) % 60)
  arrays = [batch.episode_arrays(e, *x) for e, x in zip(eps, embs)]
  pipe = _rrf(COS, BM25, weights=list(weights))
  problem, knobs, every = fit.make_problem(pipe, list(KNOBS))
  spec.check(pipe, list(KNOBS))
  rows = fit.build_rows(problem, pipe, eps, arrays, seed=DEFAULT_SEED)
  inputs = C.build_inputs(spec, eps, arrays)
  return eps, embs, arrays, pipe, problem, knobs, every, rows, inputs


def _constant_net(spec, inputs, offsets):
  """Module parameters whose output is the constant ``offsets`` for every question."""
  params = C.init_net(spec, inputs, 0)
  return jax.tree_util.tree_map_with_path(
    lambda path, x: jnp.asarray(offsets, x.dtype) if 'out' in str(path) and 'bias' in str(path) else x * 0, params
  )


def test_constant_module_equals_scalar_path_soft_and_hard():
  eps, embs, arrays, pipe, problem, knobs, every, rows, inputs = _setup()
  offsets = np.array([0.3, -0.2, 0.5], np.float32)
  raw = {p: v + o for (p, v), o in zip(knobs.raw.items(), offsets)}
  fixed = {p: jnp.asarray(v, jnp.float32) for p, v in every.items()}
  net = _constant_net(SPEC, inputs, offsets)
  # soft: per-question values through the module == the scalar knobs raw + offset
  scalar_vals = fit.effective_values(problem, raw, fixed)
  q_vals = C.question_values(problem, SPEC, knobs.raw, fixed, net, inputs.feats, inputs.query)
  for p in KNOBS:
    np.testing.assert_allclose(
      q_vals[p],
      np.full(rows.where.shape[0], float(fit.Knobs(raw=raw, transforms=problem.fitted).values()[p])),
      rtol=1e-6,
    )
  s_scalar = jax.jit(functools.partial(fit.problem.soft_scores, problem))(scalar_vals, rows)  # jitted: one compile
  s_cond = jax.jit(functools.partial(C.soft_scores, problem))(q_vals, rows)
  np.testing.assert_allclose(s_cond, s_scalar, rtol=1e-5, atol=1e-7)
  # hard: per-question fusion == the scalar pipeline through evaluation.evaluate, every question
  res = fit.FitResult(
    values={p: float(v) for p, v in scalar_vals.items() if p in KNOBS},
    raw=knobs.raw,
    learned={'conditioned': net},
    losses=[],
    train_rows=0,
    wall_s=0.0,
  )
  # and a dataset's own episode metric (FactConsolidation's answer@k is one), as evaluate computes it
  first = {'first': lambda ep, q, row, cut: float(ep.items[row[0]].id in q.gold)}
  metrics = ['ndcg@10', 'recall@10', 'first@1']
  got = components.score_episodes(
    pipe,
    problem,
    (SPEC,),
    res,
    every,
    eps,
    arrays,
    k=10,
    metrics=metrics,
    seed=0,
    indices=range(len(eps)),
    episode_metrics=first,
  )
  want = evaluation.evaluate(
    eps,
    embs,
    {'p': P.with_values(pipe, {p: float(scalar_vals[p]) for p in KNOBS})},
    k=10,
    metrics=metrics,
    seed=0,
    progress=False,
    arrays=arrays,
    episode_metrics=first,
  )
  for m in metrics:
    np.testing.assert_array_equal(got[m], want.scores['p'][m])
  assert 0 < np.mean(got['first@1']) < 1
  with pytest.raises(ValueError, match="Unknown metric 'answer@10'"):
    components.score_episodes(
      pipe, problem, (SPEC,), res, every, eps, arrays, k=10, metrics=['answer@10'], seed=0, indices=range(len(eps))
    )


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
def test_gradients_reach_the_module_and_a_fit_moves_it():
  eps, embs, arrays, pipe, problem, knobs, every, rows, inputs = _setup()
  fixed = {p: jnp.asarray(v, jnp.float32) for p, v in every.items()}
  params = {'knobs': dict(knobs.raw), 'conditioned': C.init_net(SPEC, inputs, 0)}
  g = jax.grad(fit.loss_fn)(
    params, fixed, rows, {'conditioned': inputs}, jnp.ones(rows.where.shape[0]), problem=problem, max_gold=4,
    components=(SPEC,),
  )  # fmt: skip
  out = g['conditioned']['params']['out']
  assert np.abs(np.asarray(out['kernel'])).sum() > 0 and np.abs(np.asarray(out['bias'])).sum() > 0
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree_util.tree_leaves(g))
  res = fit.fit(
    problem,
    knobs,
    every,
    rows,
    np.arange(rows.where.shape[0]),
    fit.Schedule(optax.adam(0.05), steps=5, batch_size=16, seed=1),
    components=[SPEC],
    inputs={'conditioned': inputs},
  )
  vals = C.per_question_knobs(problem, SPEC, res, every, inputs.feats, inputs.query)
  assert all(np.std(v) > 0 for v in vals.values())  # per-question values really differ
  assert len(res.losses) == 5 and np.isfinite(res.losses).all()


def test_config_errors():
  with pytest.raises(ValueError, match='non-empty subset'):
    C.Conditioning(knobs=('k0',), features=('text',), hidden=0, rank=2, net_lr_scale=1.0)
  pipe = _rrf(COS, BM25, weights=[1.0, 1.0])
  with pytest.raises(ValueError, match='only fusion knobs'):
    C.Conditioning(knobs=('legs.bm25.k1',), features=('cues',), hidden=0, rank=2, net_lr_scale=1.0).check(
      pipe, ['legs.bm25.k1']
    )
  with pytest.raises(ValueError, match='must also be in fit.params'):
    C.Conditioning(knobs=('k0',), features=('cues',), hidden=0, rank=2, net_lr_scale=1.0).check(
      pipe, ['legs.cos.weight']
    )
  with pytest.raises(ValueError, match="conditioned.form must be one of \\['offset', 'gate'\\], got 'sigmoid'"):
    C.Conditioning(knobs=('k0',), features=('cues',), hidden=0, rank=2, net_lr_scale=1.0, form='sigmoid')
  with pytest.raises(ValueError, match='conditioned.pool must be >= 1, theta in'):
    C.Conditioning(knobs=('k0',), features=('revision',), hidden=0, rank=2, net_lr_scale=1.0, theta=1.5)
  prior = P.make_pipeline(legs={'prior': {'op': 'tcfsr_prior'}}, name='gate')
  with pytest.raises(ValueError, match=r"'legs.prior.lam'.*tcfsr_prior's per-question knobs: \['gamma'\]"):
    C.Conditioning(knobs=('legs.prior.lam',), features=('cues',), hidden=0, rank=1, net_lr_scale=1.0).check(
      prior, ['legs.prior.lam']
    )
  with pytest.raises(ValueError, match="a fusion knob needs an RRF fusion; pipeline 'gate' has fusion none"):
    C.Conditioning(knobs=('legs.prior.weight',), features=('cues',), hidden=0, rank=1, net_lr_scale=1.0).check(
      prior, ['legs.prior.weight']
    )
  C.Conditioning(knobs=('legs.prior.gamma',), features=('cues',), hidden=0, rank=1, net_lr_scale=1.0).check(
    prior, ['legs.prior.gamma']
  )
  from engram_jax.fit.config import FitConfig
  from experiments.lib import fit_setup

  node = {'knobs': ['k0'], 'features': ['cues'], 'hidden': 0, 'rank': 1, 'net_lr_scale': 1.0, 'gate': True}
  with pytest.raises(ValueError, match=r"fit.conditioned: unknown keys \['gate'\]"):
    fit_setup.components_of(FitConfig.from_mapping({'conditioned': node}, ['conditioned']))
  node.pop('gate')
  node['form'] = 'gate'
  built = fit_setup.components_of(FitConfig.from_mapping({'conditioned': node}, ['conditioned']))[0]
  assert built['conditioned'].form == 'gate'


@pytest.mark.slow
def test_experiment_fits_conditioned_knobs_beside_the_scalar_fit(tmp_path):
  import json

  from test_fit import small_fit_cfg

  from experiments import fit as fit_exp

  cfg = small_fit_cfg(
    tmp_path,
    'fit.gap_checks=0',
    'fit.conditioned={knobs: [legs.cos.weight, legs.bm25.weight, k0], features: [cues, pool, query], hidden: 4, '
    'rank: 2, net_lr_scale: 0.1}',
  )
  res = fit_exp.run(cfg, tmp_path / 'out')
  c = res['variants']['conditioned']
  assert len(c['per_question']['ndcg@10']) == res['n_questions'] == 105 + 197
  assert set(res['paired']) >= {
    'conditioned - scalar fit (out of fold)',
    'conditioned - rrf_cos_bm25 (hand-set)',
    'conditioned - cosine (hand-set)',
  }
  d = res['paired']['conditioned - scalar fit (out of fold)']['ndcg@10']['delta']
  want = np.mean(c['per_question']['ndcg@10']) - np.mean(res['per_question']['fitted']['ndcg@10'])
  assert abs(d - want) < 1e-12
  assert len(json.loads((tmp_path / 'out' / 'loss_curve_conditioned.json').read_text())['conv-30']) == 2
  bad = small_fit_cfg(
    tmp_path, 'fit.conditioned={knobs: [legs.bm25.k1], features: [cues], hidden: 0, rank: 2, net_lr_scale: 0.1}'
  )
  with pytest.raises(ValueError, match='only fusion knobs'):
    fit_exp.run(bad, tmp_path / 'bad')


# ---- the learned recency gate of tcfsr_learned is one use of the conditioned knobs --------------------------------

GATE = C.Conditioning(
  knobs=('legs.prior.gamma',),
  features=('cues', 'revision', 'top_cos'),
  hidden=0,
  rank=1,
  net_lr_scale=1.0,
  form='gate',
  bias=False,
  pool=20,
  theta=0.5,
  delta=0.3,
)
CUE_TEXTS = ('what is my current job now', 'when did we meet', 'how many dogs do I have', 'where is the key')


def _revision_episodes():
  """Episodes with near-duplicate items written far apart (the revision detector opens for some questions) and
  questions with and without text cues."""
  from engram_jax.core.types import Episode, Item, Question

  rng = np.random.default_rng(11)
  eps, embs = [], []
  for e, (n, q) in enumerate([(50, 12), (40, 9)]):
    docs = rng.normal(size=(n, 16))
    docs[n // 2 : n // 2 + 8] = docs[:8] + 0.3 * rng.normal(size=(8, 16))  # restated facts, later
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    queries = docs[rng.integers(0, 8, q)] + 0.4 * rng.normal(size=(q, 16))
    queries[::3] = rng.normal(size=queries[::3].shape)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    items = tuple(Item(id=f'e{e}i{i}', text=f'item {i}', parent='s', position=i) for i in range(n))
    qs = tuple(
      Question(
        id=f'e{e}q{j}',
        text=CUE_TEXTS[j % 4],
        gold=(f'e{e}i{int(rng.integers(0, n))}',),
        gold_parents=('s',),
        category=1,
      )
      for j in range(q)
    )
    eps.append(Episode(id=f'e{e}', items=items, questions=qs))
    embs.append((docs, queries))
  return eps, embs, [batch.episode_arrays(e, *x) for e, x in zip(eps, embs)]


def test_tcfsr_learned_gate_is_the_conditioned_recency_weight_of_tcfsr_prior():
  """tcfsr_learned at gate weights u (gamma, lam, w) equals tcfsr_prior with gamma conditioned through a gate module
  of kernel u (GATE): the same features, soft loss and gradients (u <-> the module's kernel), and hard rankings."""
  from engram_jax.fit import train
  from engram_jax.ops import tcfsr_learned as TL

  eps, embs, arrays = _revision_episodes()
  u = np.array([0.8, -0.6, 0.4, -0.3, 2.5, 1.2], np.float32)  # current, when, count, bias, revision, topcos
  common = {'pool': 20, 'lam': 0.01, 'w': 0.8}
  learned = P.make_pipeline(
    legs={
      'tl': {
        'op': 'tcfsr_learned',
        **common,
        'gamma': 0.3,
        'theta': 0.5,
        'delta': 0.3,
        **{n: float(x) for n, x in zip(TL.WEIGHTS, u)},
      }
    },
    name='learned',
  )
  prior = P.make_pipeline(legs={'prior': {'op': 'tcfsr_prior', **common, 'gamma': 0.3}}, name='gate')
  p_a, k_a, e_a = fit.make_problem(learned, [f'legs.tl.{n}' for n in ('lam', 'w', 'gamma', *TL.WEIGHTS)])
  p_b, k_b, e_b = fit.make_problem(prior, ['legs.prior.lam', 'legs.prior.w', 'legs.prior.gamma'])
  GATE.check(prior, [p for p, _ in p_b.fitted])
  rows_a = fit.build_rows(p_a, learned, eps, arrays, seed=DEFAULT_SEED)
  rows_b = fit.build_rows(p_b, prior, eps, arrays, seed=DEFAULT_SEED)
  inputs = C.build_inputs(GATE, eps, arrays)
  # the features are the gate's inputs: cues, and a revision signal that is open for some questions only
  assert inputs.feats.shape == (21, 6)
  rev = np.asarray(inputs.feats[:, 4])
  assert (rev > 0).any() and (rev == 0).any() and len(np.unique(np.asarray(inputs.feats[:, :3]), axis=0)) == 4
  net = {'params': {'out': {'kernel': jnp.asarray(u)[:, None]}}}
  weight = jnp.ones(rows_b.where.shape[0])
  fixed_a = {p: jnp.asarray(v, jnp.float32) for p, v in e_a.items()}
  fixed_b = {p: jnp.asarray(v, jnp.float32) for p, v in e_b.items()}
  loss_a, g_a = jax.value_and_grad(
    lambda r: train.loss_fn({'knobs': r}, fixed_a, rows_a, {}, weight, problem=p_a, max_gold=1)
  )(dict(k_a.raw))
  loss_b, g_b = jax.value_and_grad(
    lambda prm: fit.loss_fn(prm, fixed_b, rows_b, {'conditioned': inputs}, weight, problem=p_b, max_gold=1,
                            components=(GATE,))
  )({'knobs': dict(k_b.raw), 'conditioned': net})  # fmt: skip
  np.testing.assert_allclose(loss_b, loss_a, rtol=1e-6)
  for knob in ('lam', 'w', 'gamma'):
    np.testing.assert_allclose(g_b['knobs'][f'legs.prior.{knob}'], g_a[f'legs.tl.{knob}'], rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(
    np.asarray(g_b['conditioned']['params']['out']['kernel'])[:, 0],
    [g_a[f'legs.tl.{n}'] for n in TL.WEIGHTS],
    rtol=1e-4,
    atol=1e-7,
  )
  assert abs(float(g_a['legs.tl.u_revision'])) > 0
  # hard: the conditioned scorer ranks every question as tcfsr_learned does
  res = fit.FitResult(
    values={'legs.prior.lam': 0.01, 'legs.prior.w': 0.8, 'legs.prior.gamma': 0.3},
    raw=k_b.raw,
    learned={'conditioned': net},
    losses=[],
    train_rows=0,
    wall_s=0.0,
  )
  metrics = ['ndcg@10', 'recall@10']
  got = components.score_episodes(
    prior, p_b, (GATE,), res, e_b, eps, arrays, k=10, metrics=metrics, seed=0, indices=range(len(eps))
  )
  want = evaluation.evaluate(eps, embs, {'tl': learned}, k=10, metrics=metrics, seed=0, progress=False, arrays=arrays)
  for m in metrics:
    np.testing.assert_array_equal(got[m], want.scores['tl'][m])
  # and the gate moved the rankings: the same module at u = 0 (gamma / 2 for everyone) ranks differently
  flat = fit.FitResult(
    values=res.values,
    raw=k_b.raw,
    learned={'conditioned': jax.tree_util.tree_map(jnp.zeros_like, net)},
    losses=[],
    train_rows=0,
    wall_s=0.0,
  )
  scores = lambda r: np.asarray(
    jax.jit(lambda a, f, q: _hard_topk(prior, p_b, GATE, r, e_b, a, f, q, jax.random.key(0), k=10))(
      arrays[0],
      jnp.asarray(np.pad(inputs.feats[:12], [(0, arrays[0].queries.shape[0] - 12), (0, 0)])),
      jnp.asarray(arrays[0].queries),
    )
  )
  assert not np.array_equal(scores(res), scores(flat))
