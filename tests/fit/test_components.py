"""Learned components combine in one fit: the query adapter and the conditioned knobs together (one parameter
pytree, one optimizer with a learning-rate group each through optax.partition). At their initial parameters
(identity adapter, zero module output) the combined soft loss is the scalar one; a fit moves both; the hard scorer
applies both (adapted queries, per-question fusion knobs)."""

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
from engram_jax.fit import artifact
from engram_jax.fit import conditioned as C
from engram_jax.fit.folds import DEFAULT_SEED

PARAMS = ['legs.cos.weight', 'legs.cfsr.weight', 'legs.cfsr.lam', 'legs.cfsr.w', 'k0']
COND = C.Conditioning(knobs=('legs.cos.weight', 'k0'), features=('pool', 'query'), hidden=0, rank=2, net_lr_scale=0.5)
ADAPTER = A.Adapter(rank=2, lr_scale=0.1)


def _setup():
  eps, embs = _episodes(n_eps=2, n=40, q=16, d=12, seed=5, gold=lambda e: (np.arange(16) * 3) % 40)
  arrays = [batch.episode_arrays(e, *x) for e, x in zip(eps, embs)]
  pipe = _rrf(COS, ('cfsr', {'op': 'cfsr', 'pool': 12, 'iterations': 80}, 10), weights=[1.0, 1.0])
  problem, knobs, every = fit.make_problem(pipe, PARAMS, settings=fit.Settings(cfsr_grad='implicit', solve_batch=None))
  rows = fit.build_rows(problem, pipe, eps, arrays, seed=DEFAULT_SEED)
  inputs = {c.name: c.inputs(problem, eps, arrays) for c in (ADAPTER, COND)}
  return eps, embs, arrays, pipe, problem, knobs, every, rows, inputs


def test_group_optimizer_scales_each_component():
  opt = fit.group_optimizer(optax.sgd(1.0), [ADAPTER, COND])
  params = {'knobs': {'k0': jnp.zeros(())}, 'adapter': {'u': jnp.zeros(2)}, 'conditioned': {'w': jnp.zeros(3)}}
  grads = jax.tree_util.tree_map(jnp.ones_like, params)
  updates, _ = opt.update(grads, opt.init(params), params)
  assert float(updates['knobs']['k0']) == -1.0
  np.testing.assert_allclose(updates['adapter']['u'], -0.1)
  np.testing.assert_allclose(updates['conditioned']['w'], -0.5)


@pytest.mark.slow  # two compiles of the combined loss
def test_adapter_and_conditioned_knobs_combine_in_one_fit():
  eps, embs, arrays, pipe, problem, knobs, every, rows, inputs = _setup()
  fixed = {p: jnp.asarray(v, jnp.float32) for p, v in every.items()}
  w = jnp.ones(rows.where.shape[0])
  both = (ADAPTER, COND)
  params = {'knobs': dict(knobs.raw), **{c.name: c.init(inputs[c.name], 0) for c in both}}
  got = jax.jit(functools.partial(fit.loss_fn, problem=problem, max_gold=4, components=both))(
    params, fixed, rows, inputs, w
  )
  want = jax.jit(functools.partial(fit.loss_fn, problem=problem, max_gold=4))({'knobs': knobs.raw}, fixed, rows, {}, w)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  res = fit.fit(
    problem, knobs, every, rows, np.arange(20), fit.Schedule(optax.adam(0.05), steps=3, batch_size=8, seed=0),
    components=both, inputs=inputs,
  )  # fmt: skip
  assert np.abs(res.learned['adapter']['u']).sum() > 0
  assert np.abs(np.asarray(res.learned['conditioned']['params']['out']['kernel'])).sum() > 0
  scored = artifact.score(pipe, problem, every, res, both, eps, embs, None, k=10, metrics=['ndcg@10'], seed=0)
  alone = artifact.score(pipe, problem, every, res, (COND,), eps, embs, arrays, k=10, metrics=['ndcg@10'], seed=0)
  assert scored['ndcg@10'].shape == (32,) and not np.array_equal(scored['ndcg@10'], alone['ndcg@10'])


def test_a_variant_needs_all_its_components(tmp_path):
  from test_fit import small_fit_cfg

  from experiments.lib import common, fit_setup

  cfg = small_fit_cfg(tmp_path, 'fit.adapter={rank: 2, lr_scale: 0.1, cfsr_grad: implicit, soft_query_legs: true}',
                      '+fit.variants.combined=[adapter,conditioned]')  # fmt: skip
  with pytest.raises(ValueError, match=r"fit.variants.combined fits \['adapter', 'conditioned'\] together; set "
                     r'fit.conditioned too'):  # fmt: skip
    fit_setup.build(cfg, common.hand_set_pipeline('rrf_cos_bm25', cfg.pipeline.rrf_cos_bm25))


@pytest.mark.slow
def test_experiment_fits_the_combined_variant_from_config(tmp_path):
  """+fit.variants.combined=[adapter,conditioned] with fit.adapter and fit.conditioned: a third fit with both components, scored out of fold,
  paired with the scalar, the adapter and the conditioned fits, its artifact applying both."""
  import json

  from test_fit import small_fit_cfg

  from experiments import fit as fit_exp

  cfg = small_fit_cfg(
    tmp_path,
    'fit.gap_checks=0',
    'fit.adapter={rank: 2, lr_scale: 0.1, cfsr_grad: implicit, soft_query_legs: true}',
    'fit.conditioned={knobs: [legs.cos.weight, k0], features: [cues, pool, query], hidden: 0, rank: 2, '
    'net_lr_scale: 0.1}',
    '+fit.variants.combined=[adapter,conditioned]',
  )
  res = fit_exp.run(cfg, tmp_path / 'out')
  c = res['variants']['combined']
  assert len(c['per_question']['ndcg@10']) == res['n_questions'] == 105 + 197
  for other in ('scalar fit', 'adapter', 'conditioned'):
    d = res['paired'][f'combined - {other} (out of fold)']['ndcg@10']['delta']
    want = res['per_question']['fitted'] if other == 'scalar fit' else res['variants'][other]['per_question']
    assert abs(d - (np.mean(c['per_question']['ndcg@10']) - np.mean(want['ndcg@10']))) < 1e-12
  assert set(c['spec']) == {'adapter', 'conditioned'} and c['knob_stats'] and c['mean_cos_to_base']
  assert 'combined - cosine (hand-set)' in res['paired']
  assert json.loads((tmp_path / 'out' / 'artifact' / 'variants.json').read_text()) == [
    'fitted', 'conditioned', 'adapter', 'combined'
  ]  # fmt: skip
  manifest = json.loads((tmp_path / 'out' / 'artifact' / 'combined' / 'manifest.json').read_text())
  assert {c['name'] for c in manifest['components']} == {'adapter', 'conditioned'}
  assert '(combined, out of fold)' in (tmp_path / 'out' / 'results.md').read_text()


def test_from_config_refuses_a_string_for_a_bool_field():
  """``bool('false')`` is True: a string for a bool field is refused in one line naming the key, not guessed."""
  from engram_jax.core.errors import EngramError
  from engram_jax.fit import components

  node = {'rank': 2, 'lr_scale': 1, 'cfsr_grad': 'implicit'}
  assert components.from_config('adapter', {**node, 'soft_query_legs': True}).soft_query_legs is True
  assert components.from_config('adapter', {**node, 'soft_query_legs': np.bool_(False)}).soft_query_legs is False
  with pytest.raises(EngramError, match=r"^fit.adapter.soft_query_legs: expected true or false, got 'false'$"):
    components.from_config('adapter', {**node, 'soft_query_legs': 'false'})
  with pytest.raises(EngramError, match=r'^fit.adapter.rank: '):
    components.from_config('adapter', {**node, 'rank': 'two'})
