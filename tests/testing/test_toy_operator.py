"""A new operator in one file: declared and registered here, then evaluated, fitted and benched with no other change.

The toy operator ``toy`` is "cosine plus a learned constant times write position":

.. math:: s_i = \\cos(q, d_i) + c\\, t_i, \\qquad t_i = p_i / \\max(N_{real} - 1, 1)

with one fittable knob ``c`` (default 0.0, transform ``identity``). Its soft twin needs nothing precomputed beyond
the fit's context (cosine, positions, real items), so its ``rows`` are empty.

The operator is registered by a module-scoped fixture (``register(..., replace=True)``, so a re-registration is
harmless) and removed afterwards, so that tests elsewhere that iterate the registry never see it. An out-of-tree
module would call ``register`` at import time and be named in a run's ``ops_modules`` instead.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from jax import Array

from engram_jax import fit
from engram_jax.core.batch import EpisodeArrays, episode_arrays
from engram_jax.data import io
from engram_jax.eval import pipeline as P
from engram_jax.ops import OPERATORS, Knob, Operator, SoftTwin, register
from engram_jax.ops.cosine import cosine_scores
from engram_jax.testing import reference as ref
from engram_jax.testing.synthetic import synthetic_episodes

CONF = str(Path(__file__).resolve().parents[2] / 'conf')
try:
  HAVE = (io.resolve_data_root() / 'locomo' / 'locomo10.json').is_file()
except FileNotFoundError:
  HAVE = False
real = pytest.mark.skipif(not HAVE, reason='LoCoMo not found under the data root')
TOY_NODE = {'fusion': 'none', 'legs': {'toy': {'op': 'toy', 'c': 0.5}}}


# ---- the operator: hard leg, soft twin, declaration --------------------------------------------------------------


def write_fraction(positions: Array, where: Array) -> Array:
  """Write-order fraction ``[..., N]``: ``p_i / max(N_real - 1, 1)`` (``N_real`` per list), 0 for masked items."""
  n_real = jnp.sum(where, axis=-1, keepdims=True)
  t = positions.astype(jnp.float32) / jnp.maximum(n_real - 1, 1).astype(jnp.float32)
  return jnp.where(where, t, 0.0)


def toy_leg(ep: EpisodeArrays, key: Array, *, c: float = 0.0) -> Array:
  """``[Q, N]``: cosine + ``c`` x write fraction; ``-inf`` for masked items."""
  del key
  s = cosine_scores(ep.queries, ep.docs, where=ep.where)
  return jnp.where(ep.where, s + c * write_fraction(ep.positions, ep.where), -jnp.inf)


def _rows(ep: EpisodeArrays, n_questions: int, n_pad: int, options: Mapping[str, Any], settings) -> dict:
  """Nothing to precompute: the context already holds the cosine and the positions of every question."""
  del ep, n_questions, n_pad, options, settings
  return {}


def _soft(rows: Mapping[str, Array], values: Mapping[str, Array], ctx: fit.SoftContext) -> Array:
  """``[B, N]``: the hard formula itself (smooth in ``c``), on a batch of questions."""
  del rows
  t = write_fraction(ctx.positions, ctx.where)
  return jnp.where(ctx.where, ctx.cos + values['c'] * t, -jnp.inf)


TOY = Operator(
  name='toy',
  leg=toy_leg,
  doc='toy: cosine + c * write fraction',
  knobs=(Knob('c', 0.0, transform='identity', doc='weight of the write fraction'),),
  soft=SoftTwin(rows=_rows, scores=_soft),
)


@pytest.fixture(scope='module', autouse=True)
def toy_registered():
  before = OPERATORS.get('toy')
  register(TOY, replace=True)
  register(TOY, replace=True)  # a second registration (a re-import) is harmless
  yield TOY
  if before is None:
    OPERATORS.pop('toy', None)
  else:
    OPERATORS['toy'] = before


def _compose(config_name: str, overrides: list[str]):
  with initialize_config_dir(config_dir=CONF, version_base='1.3'):
    return compose(config_name=config_name, overrides=overrides)


# ---- the declaration alone --------------------------------------------------------------------------------------


def test_declaration_validates_and_is_fittable():
  assert P.make_pipeline(name='toy', legs={'toy': {'op': 'toy'}}).legs[0].option('c') == 0.0
  pipe = P.make_pipeline(name='toy', legs=TOY_NODE['legs'])
  assert fit.fittable_paths(pipe) == ['legs.toy.c']
  with pytest.raises(ValueError, match='has no knob'):
    P.make_pipeline(name='toy', legs={'toy': {'op': 'toy', 'd': 1.0}})


def test_soft_twin_is_the_hard_leg():
  eps = synthetic_episodes(n_episodes=2, n_queries=6, dim=16, n_items=(30, 50), seed=1)
  episodes = [b.episode for b in eps]
  arrays = [episode_arrays(b.episode, b.docs, b.queries) for b in eps]
  pipe = P.make_pipeline(name='toy', legs={'toy': {'op': 'toy', 'c': 0.7}})
  problem, _, every = fit.make_problem(pipe, ['legs.toy.c'])
  rows = fit.build_rows(problem, pipe, episodes, arrays, seed=0)
  soft = np.asarray(fit.soft_scores(problem, {p: jnp.asarray(v) for p, v in every.items()}, rows))
  at = 0
  for b, arr in zip(eps, arrays):
    n, q = b.episode.n_items, len(b.episode.questions)
    hard = np.asarray(toy_leg(arr, jax.random.key(0), c=0.7))[:q, :n]
    np.testing.assert_allclose(soft[at : at + q, :n], hard, rtol=1e-5, atol=1e-6)
    assert np.all(np.isneginf(soft[at : at + q, n:]))
    at += q


# ---- (a) evaluated from a config ----------------------------------------------------------------------------------


@pytest.mark.slow
@real
def test_evaluated_from_config(tmp_path):
  from experiments import evaluate

  # The toy pipeline is added as a config node next to the composed `cosine` one (`+pipeline.toy=...`).
  cfg = _compose(
    'config',
    [
      'embedder=hashing',
      'dataset.loader.conversations=[conv-30]',
      'pipeline=[cosine]',
      '+pipeline.toy={fusion: none, legs: {toy: {op: toy, c: 0.5}}}',
      'eval.n_resamples=100',
      'eval.progress=false',
      f'paths.cache_dir={tmp_path}/cache',
    ],
  )
  assert list(cfg.pipeline) == ['cosine', 'toy']
  evaluate.run(cfg, tmp_path / 'out')
  saved = json.loads((tmp_path / 'out' / 'results.json').read_text())
  assert set(saved['pipelines']) == {'cosine', 'toy'}
  assert 0 <= saved['pipelines']['toy']['ndcg@10'] <= 1
  rows = saved['per_question']
  assert len(rows) == saved['n_questions'] > 0
  assert all(len(r['retrieved']['toy']) == 10 for r in rows)
  # c = 0.5 moves recent turns up: the toy's lists differ from cosine's on some questions
  assert sum(r['retrieved']['toy'] != r['retrieved']['cosine'] for r in rows) > 0


# ---- (b) fitted by gradient ---------------------------------------------------------------------------------------


@pytest.mark.slow
@real
def test_fitted_by_experiments_fit(tmp_path):
  from experiments import fit as fit_exp

  # fusion none is enough: the loss is approx-NDCG on soft ranks of the final scores cos + c t, which move with c
  # (the toy's soft twin is the hard formula), so the gradient in c is not zero and no RRF wrapper is needed.
  # experiments.fit fits exactly one pipeline: `pipeline=[]` empties the composed group, then the toy's node is added.
  cfg = _compose(
    'fit',
    [
      'embedder=hashing',
      'dataset.loader.conversations=[conv-30,conv-26]',
      'pipeline=[]',
      '+pipeline.toy={fusion: none, legs: {toy: {op: toy, c: 0.0}}}',
      'fit.params=[legs.toy.c]',
      'fit.folds=2',
      'fit.steps=4',
      'fit.batch_size=32',
      'fit.baselines=[cosine]',
      'eval.n_resamples=100',
      'eval.progress=false',
      f'paths.cache_dir={tmp_path}/cache',
    ],
  )
  assert list(cfg.pipeline) == ['toy']
  res = fit_exp.run(cfg, tmp_path / 'out')
  fitted = json.loads((tmp_path / 'out' / 'fitted.json').read_text())
  assert fitted['pipeline'] == 'toy' and sorted(fitted['folds']) == ['conv-26', 'conv-30']
  for values in fitted['folds'].values():
    assert set(values) == {'legs.toy.c'}
    assert np.isfinite(values['legs.toy.c']) and abs(values['legs.toy.c'] - 0.0) > 1e-3  # moved by gradient
  curves = json.loads((tmp_path / 'out' / 'loss_curve.json').read_text())
  assert all(len(c) == 4 for c in curves.values())
  saved = json.loads((tmp_path / 'out' / 'results.json').read_text())
  assert saved['params'] == ['legs.toy.c'] and saved['hand_set']['legs.toy.c'] == 0.0
  oof = saved['summary']['toy (fitted, out of fold)']
  assert 0 <= oof['ndcg@10']['mean'] <= 1
  assert len(saved['per_question']['fitted']['ndcg@10']) == res['n_questions'] > 0


# ---- (c) timed by the bench ---------------------------------------------------------------------------------------


def test_timed_by_the_bench(monkeypatch):
  from experiments.bench import operators as bench

  eps = synthetic_episodes(n_episodes=1, n_queries=8, dim=16, n_items=(40, 60))
  (row,) = bench.time_operators(eps, ['toy'], repeats=1, overrides={'toy': {'c': 0.3}})
  assert row['op'] == 'toy' and row['jax_s'] > 0 and row['options'] == {'c': 0.3}
  assert row['ref_s'] is None and row['ratio'] is None  # no NumPy reference: JAX side only
  assert '| toy |' in bench.format_table([row], n_episodes=1, n_queries=8) and 'n/a' in bench.format_table(
    [row], n_episodes=1, n_queries=8
  )

  # With a reference adapter (one dict entry), the bench also times it and checks agreement.
  def toy_ref(e, i, o):
    n = e.docs.shape[0]
    return ref.cosine_scores_ref(e.queries[i], e.docs) + o['c'] * e.positions / max(n - 1, 1)

  monkeypatch.setitem(bench.REFERENCES, 'toy', toy_ref)
  (row,) = bench.time_operators(eps, ['toy'], repeats=1, ref_queries=0, overrides={'toy': {'c': 0.3}})
  assert row['ref_s'] > 0 and row['ratio'] > 0 and row['agree'] == row['checked'] == 8
