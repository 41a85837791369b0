"""Low-rank query adapter: the identity adapter reproduces the soft pipeline's loss, gradients reach U and V through
the fitted CFS-R leg's pool cosines (implicit and unrolled NNLS gradients agree when converged) and, with
soft_query_legs, through the soft-ranked cosine leg (cold, it fuses as the hard one); an adapter with no gradient
path and forward mode are refused; adapted queries are unit-norm."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_fit import COS, _episodes, _rrf

from engram_jax import fit
from engram_jax.core import batch
from engram_jax.fit import adapter as A
from engram_jax.fit.folds import DEFAULT_SEED
from engram_jax.fit.train import loss_fn as scalar_loss

PARAMS = ['legs.cos.weight', 'legs.cfsr.weight', 'legs.cfsr.lam', 'legs.cfsr.w', 'k0']


def _setup(grad='implicit', iterations=80):
  eps, embs = _episodes(n_eps=2, n=40, q=16, d=12, seed=5, gold=lambda e: (np.arange(16) * 3) % 40)
  arrays = [batch.episode_arrays(e, *x) for e, x in zip(eps, embs)]
  pipe = _rrf(COS, ('cfsr', {'op': 'cfsr', 'pool': 12, 'iterations': iterations}, 10), weights=[1.0, 1.0])
  problem, knobs, every = fit.make_problem(pipe, PARAMS, settings=fit.Settings(cfsr_grad=grad, solve_batch=None))
  rows = fit.build_rows(problem, pipe, eps, arrays, seed=DEFAULT_SEED)
  return problem, knobs, every, rows, A.build_inputs(eps, arrays)


def test_identity_adapter_is_the_soft_pipeline():
  problem, knobs, every, rows, inputs = _setup()
  fixed = {p: jnp.asarray(v, jnp.float32) for p, v in every.items()}
  adapter = A.Adapter(rank=3, lr_scale=1.0)
  params = {'knobs': dict(knobs.raw), 'adapter': A.init_params(adapter, 12, 0)}
  w = jnp.ones(rows.where.shape[0])
  r = A.adapted_rows(problem, rows, inputs, params['adapter'])
  np.testing.assert_allclose(r.cos, rows.cos, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(r.legs[1]['pool_cos'], rows.legs[1]['pool_cos'], rtol=1e-5, atol=1e-6)
  # jitted (one compilation each) rather than dispatched op by op
  got = jax.jit(functools.partial(fit.loss_fn, problem=problem, max_gold=4, components=(adapter,)))(
    params, fixed, rows, {'adapter': inputs}, w
  )
  want = jax.jit(functools.partial(fit.loss_fn, problem=problem, max_gold=4))({'knobs': knobs.raw}, fixed, rows, {}, w)
  np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.slow
def test_gradients_reach_the_adapter_and_modes_agree_when_converged():
  grads = {}
  for mode in ('implicit', 'reverse'):
    problem, knobs, every, rows, inputs = _setup(mode, iterations=3000)
    fixed = {p: jnp.asarray(v, jnp.float32) for p, v in every.items()}
    adapter = A.Adapter(rank=3, lr_scale=1.0)
    params = {'knobs': dict(knobs.raw), 'adapter': A.init_params(adapter, 12, 0)}
    params['adapter']['u'] = params['adapter']['u'] + 0.05  # off the identity, so V gets a gradient too
    grads[mode] = jax.grad(fit.loss_fn)(
      params, fixed, rows, {'adapter': inputs}, jnp.ones(rows.where.shape[0]), problem=problem, max_gold=4,
      components=(adapter,),
    )['adapter']  # fmt: skip
  for m in ('u', 'v'):
    assert np.abs(np.asarray(grads['implicit'][m])).sum() > 0
    np.testing.assert_allclose(grads['implicit'][m], grads['reverse'][m], rtol=2e-3, atol=1e-6)


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
def test_fit_runs_forward_mode_is_refused_and_queries_stay_unit():
  problem, knobs, every, rows, inputs = _setup()
  res = fit.fit(
    problem,
    knobs,
    every,
    rows,
    np.arange(20),
    fit.Schedule(optax.adam(0.05), steps=3, batch_size=8, seed=0),
    components=[A.Adapter(rank=2, lr_scale=0.5)],
    inputs={'adapter': inputs},
  )
  assert np.abs(res.learned['adapter']['u']).sum() > 0 and len(res.losses) == 3
  q = A.adapt_queries(res.learned['adapter'], np.asarray(inputs.query))
  np.testing.assert_allclose(np.linalg.norm(q, axis=-1), 1.0, rtol=1e-5)
  problem_f, *_ = _setup('forward')
  with pytest.raises(ValueError, match='cfsr_grad=implicit or reverse'):
    A.Adapter(rank=2, lr_scale=1.0).check(problem_f)


@pytest.mark.slow
def test_experiment_fits_an_adapter_beside_the_scalar_fit(shared_run):
  from shared_fits import adapter_fit

  _, res = adapter_fit(shared_run)  # the session's adapter fit (tests/fit/test_artifact.py reads it too)
  a = res['variants']['adapter']
  assert len(a['per_question']['ndcg@10']) == res['n_questions']
  d = res['paired']['adapter - scalar fit (out of fold)']['ndcg@10']['delta']
  assert abs(d - (np.mean(a['per_question']['ndcg@10']) - np.mean(res['per_question']['fitted']['ndcg@10']))) < 1e-12
  assert all(0.9 < v <= 1.0 + 1e-6 for v in a['mean_cos_to_base'].values())
  assert min(a['mean_cos_to_base'].values()) < 1.0 - 1e-7  # it learned through the soft-ranked cosine leg
  for g in a['train_gap'].values():  # the training questions' soft objective and hard scores, per fold
    assert g['train_questions'] > 0 and all(
      0.0 <= g[x] <= 1.0 for x in ('soft_ndcg', 'hard_ndcg_adapted', 'hard_ndcg_base_query')
    )


def _cos_bm25_setup():
  eps, embs = _episodes(n_eps=2, n=40, q=16, d=12, seed=5, gold=lambda e: (np.arange(16) * 3) % 40)
  arrays = [batch.episode_arrays(e, *x) for e, x in zip(eps, embs)]
  pipe = _rrf(COS, ('bm25', {'op': 'bm25'}, 10), weights=[1.0, 1.0])
  problem, knobs, every = fit.make_problem(pipe, ['legs.cos.weight', 'k0'])
  rows = fit.build_rows(problem, pipe, eps, arrays, seed=DEFAULT_SEED)
  fixed = {p: jnp.asarray(v, jnp.float32) for p, v in every.items()}
  return problem, knobs, fixed, rows, A.build_inputs(eps, arrays)


def _adapter_grad(problem, knobs, fixed, rows, inputs, soft_legs):
  adapter = A.Adapter(rank=2, lr_scale=1.0, soft_query_legs=bool(soft_legs))
  params = {'knobs': dict(knobs.raw), 'adapter': A.init_params(adapter, 12, 0)}
  loss = functools.partial(fit.loss_fn, problem=problem, max_gold=4, components=(adapter,))
  grads = jax.jit(jax.grad(loss))(params, fixed, rows, {'adapter': inputs}, jnp.ones(rows.where.shape[0]))
  return np.asarray(grads['adapter']['u'])


def test_soft_query_legs_give_the_cosine_leg_a_gradient_that_is_cold_hard():
  """Without a fitted CFS-R leg the adapter learns only through a soft-ranked cosine leg: refused when that is off,
  a nonzero gradient when on; cold, the soft-ranked constant leg fuses as the hard-ranked one."""
  problem, knobs, fixed, rows, inputs = _cos_bm25_setup()
  with pytest.raises(ValueError, match='soft_query_legs=true'):
    A.Adapter(rank=2, lr_scale=1.0).check(problem)
  A.Adapter(rank=2, lr_scale=1.0, soft_query_legs=True).check(problem)
  assert A.query_legs(problem) == (0,)
  assert np.abs(_adapter_grad(problem, knobs, fixed, rows, inputs, (0,))).sum() > 0
  vals = {**fixed, **knobs.values()}
  cold = jax.jit(lambda v, r, soft: fit.soft_scores(problem, v, r, 1e-9, soft_constant=soft), static_argnums=2)
  real = np.asarray(rows.where)
  np.testing.assert_allclose(
    np.where(real, cold(vals, rows, (0,)), 0.0), np.where(real, cold(vals, rows, ()), 0.0), rtol=1e-4, atol=1e-6
  )


@pytest.mark.slow  # the counterfactual of the test above (a second compile of the gradient)
def test_a_hard_ranked_cosine_leg_passes_the_adapter_no_gradient():
  problem, knobs, fixed, rows, inputs = _cos_bm25_setup()
  assert np.abs(_adapter_grad(problem, knobs, fixed, rows, inputs, ())).sum() == 0


@pytest.mark.slow  # a diagnostic's check; test_identity_adapter_is_the_soft_pipeline keeps the same identity fast
def test_soft_ndcg_of_an_identity_adapter_is_the_scalar_objective():
  """The training-gap diagnostic's soft side: batched (padded, weighted) approx-NDCG of an identity adapter equals
  1 - the scalar fit's loss on the same rows."""
  problem, knobs, every, rows, inputs = _setup()
  spec = A.Adapter(rank=3, lr_scale=1.0)
  res = fit.FitResult(
    values={},
    learned={'adapter': {k: np.asarray(v) for k, v in A.init_params(spec, 12, 0).items()}},
    losses=[],
    train_rows=0,
    wall_s=0.0,
    raw={k: np.asarray(v) for k, v in knobs.raw.items()},
  )
  idx = np.arange(rows.where.shape[0])
  got = fit.soft_objective(
    problem, res, every, rows, idx, scale=1.0, max_gold=4, batch_size=12, components=[spec], inputs={'adapter': inputs}
  )
  fixed = {p: jnp.asarray(v, jnp.float32) for p, v in every.items()}
  want = 1.0 - float(
    jax.jit(functools.partial(scalar_loss, problem=problem, max_gold=4))(
      {'knobs': knobs.raw}, fixed, rows, {}, jnp.ones(len(idx))
    )
  )
  np.testing.assert_allclose(got, want, rtol=1e-5)
