"""Issue 41's probes of silent wrong numbers and crashes in the statistics, the config values and the public
operators: each a one-line error before any work (each test fails on the code before the fix)."""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from engram_jax import (
  additive_fuse,
  bm25_scores,
  cfs_select,
  cfsr_scores,
  cosine_scores,
  make_pipeline,
  mmr_select,
  perturbed_cosine,
  rrf_fuse,
  soft_cfs_select,
  soft_mmr_select,
  soft_rrf_fuse,
  soft_tcfsr_gated_scores,
  tcfsr_basis_scores,
  tcfsr_gated_scores,
  tcfsr_learned_scores,
  tcfsr_prior_scores,
  tide_scores,
)
from engram_jax.metrics import stats
from experiments import collect, compare
from experiments.lib import checks

CONF = str(Path(__file__).resolve().parents[2] / 'conf')


def _compose(overrides=(), name='config'):
  with initialize_config_dir(config_dir=CONF, version_base='1.3'):
    return compose(config_name=name, overrides=list(overrides))


def _one_line(e):
  assert '\n' not in str(e.value)


# ---- statistics: too few resamples --------------------------------------------------------------------------------


@pytest.mark.parametrize('name', ['config', 'fit'])
@pytest.mark.parametrize('n', [1, 0, 99])
def test_too_few_resamples_are_refused_before_any_work(name, n):
  """``eval.n_resamples=1`` printed a "95% CI" that excluded its own estimate, p 1.0."""
  check = checks.check_evaluate if name == 'config' else checks.check_fit
  with pytest.raises(ValueError, match=rf'eval.n_resamples must be an integer >= 100 .*got {n}$') as e:
    check(_compose([f'eval.n_resamples={n}'], name=name))
  _one_line(e)
  check(_compose(['eval.n_resamples=100'], name=name))


@pytest.mark.parametrize(
  'call',
  [
    lambda n: stats.bootstrap_ci(np.linspace(0, 1, 40), seed=0, n_resamples=n),
    lambda n: stats.bootstrap_cis(np.linspace(0, 1, 40)[None], seed=0, n_resamples=n),
    lambda n: stats.bootstrap_means(np.linspace(0, 1, 40)[None], seed=0, n_resamples=n),
    lambda n: stats.paired_test(np.linspace(0, 1, 40), np.zeros(40), seed=0, n_resamples=n),
    lambda n: stats.paired_tests(np.linspace(0, 1, 40)[None], np.zeros((1, 40)), seed=0, n_resamples=n),
    lambda n: stats.sign_flip_pvalues(np.linspace(0, 1, 40)[None], seed=0, n_resamples=n),
  ],
)
def test_the_library_refuses_too_few_resamples(call):
  for n in (1, 0, stats.MIN_RESAMPLES - 1, 100.0):
    with pytest.raises(ValueError, match=rf'n_resamples must be an integer >= {stats.MIN_RESAMPLES} ') as e:
      call(n)
    _one_line(e)
  call(stats.MIN_RESAMPLES)


def _results(path: Path, values) -> Path:
  scores = {'cosine': {'ndcg@10': list(values)}, 'bm25': {'ndcg@10': list(values[::-1])}}
  qids = [f'q{i}' for i in range(len(values))]
  path.write_text(json.dumps({'datasets': {'d': {'per_question': {'question_ids': qids, 'scores': scores}}}}))
  return path


@pytest.mark.parametrize('n', ['0', '1'])
def test_compare_and_collect_refuse_too_few_resamples(tmp_path, n):
  """``--n-resamples 0`` crashed with ``IndexError: index -1 is out of bounds``; 1 gave a CI excluding its delta."""
  a = _results(tmp_path / 'a.json', np.linspace(0, 1, 30))
  with pytest.raises(ValueError, match=rf'--n-resamples must be an integer >= 100 .*got {n}$') as e:
    compare.main([str(a), '--pairs', 'cosine:bm25', '--n-resamples', n])
  _one_line(e)
  with pytest.raises(ValueError, match=rf'--n-resamples must be an integer >= 100 .*got {n}$') as e:
    collect.main([str(tmp_path / 'nothing here'), '--n-resamples', n])  # refused before the folder is read
  _one_line(e)


# ---- pipeline knobs: finite values ---------------------------------------------------------------------------------


@pytest.mark.parametrize('value', [float('inf'), float('nan'), -1.0])
def test_a_leg_weight_must_be_finite_and_non_negative(value):
  with pytest.raises(ValueError, match=rf'leg c: weight must be >= 0 and finite \(fusion weight\), got {value}') as e:
    make_pipeline(legs={'c': {'op': 'cosine', 'weight': value}, 'b': {'op': 'bm25'}}, fusion='rrf')
  _one_line(e)


@pytest.mark.parametrize(
  'leg, match',
  [
    ({'op': 'cfsr', 'lam': float('inf')}, r'lam must be a finite number \(ridge strength\), got inf'),
    ({'op': 'cfs', 'sigma': float('inf')}, r'sigma must be a finite number \(a Gaussian width\), got inf'),
    ({'op': 'bm25', 'k1': float('inf')}, r'k1 must be a finite number'),
    ({'op': 'tide', 'recency': float('inf')}, r'recency must be a finite number \(recency weight w\), got inf'),
    ({'op': 'tide', 'recency': float('nan')}, r'recency must be a finite number \(recency weight w\), got nan'),
    ({'op': 'tcfsr_prior', 'gamma': -float('inf')}, r'gamma must be a finite number'),
    ({'op': 'cos2', 'eps': float('inf')}, r'eps must be a finite number'),
  ],
)
def test_every_float_knob_must_be_finite(leg, match):
  with pytest.raises(ValueError, match=match) as e:
    make_pipeline(legs={'x': leg})
  _one_line(e)


def test_k0_must_be_finite():
  with pytest.raises(ValueError, match=r'k0 must be > 0 and finite \(RRF rank offset\), got inf') as e:
    make_pipeline(legs={'c': {'op': 'cosine'}, 'b': {'op': 'bm25'}}, fusion='rrf', k0=float('inf'))
  _one_line(e)


def test_an_infinite_leg_weight_on_the_command_line_is_refused():
  """``++pipeline.rrf_cos_bm25_cfsr.legs.cos.weight=inf`` scored ndcg@10 0.0720 against 0.1379, no warning."""
  from experiments.lib import common

  cfg = _compose(['pipeline=[rrf_cos_bm25_cfsr]', '++pipeline.rrf_cos_bm25_cfsr.legs.cos.weight=inf'])
  with pytest.raises(ValueError, match=r'leg cos: weight must be >= 0 and finite .*got inf') as e:
    common.hand_set_pipeline('rrf_cos_bm25_cfsr', cfg.pipeline.rrf_cos_bm25_cfsr)
  _one_line(e)


# ---- integer settings ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
  'overrides, name, match',
  [
    (['eval.k=10.5'], 'config', r'eval.k must be an integer >= 1, got 10.5$'),
    (['eval.k=10.5', 'pipeline=rrf_cos_bm25'], 'fit', r'eval.k must be an integer >= 1, got 10.5$'),
    (['fit.steps=2.5'], 'fit', r'fit.steps must be an integer >= 1, got 2.5$'),
    (['fit.folds=2.5'], 'fit', r'fit.folds must be an integer >= 2 for cross-fitting, got 2.5$'),
    (['fit.batch_size=16.5'], 'fit', r'fit.batch_size must be an integer >= 1, got 16.5$'),
    (['fit.solve_batch=0'], 'fit', r'fit.solve_batch must be an integer >= 1 \(or null'),
  ],
)
def test_integer_settings_refuse_fractions(overrides, name, match):
  """``eval.k=10.5`` passed validation and failed inside JAX (``Shapes must be 1D sequences of ... integer``)."""
  check = checks.check_evaluate if name == 'config' else checks.check_fit
  with pytest.raises(ValueError, match=match) as e:
    check(_compose(overrides, name=name))
  _one_line(e)


@pytest.mark.parametrize(
  'leg, match',
  [
    ({'op': 'cfsr', 'pool': 20.5}, r'pool must be an integer >= 1 \(cosine pool P\), got 20.5'),
    ({'op': 'cfsr', 'iterations': 8.5}, r'iterations must be an integer >= 0'),
    ({'op': 'mmr', 'k': 10.5}, r'k must be an integer >= 1'),
    ({'op': 'cosine', 'depth': 10.5}, r'depth must be an integer >= 1'),
  ],
)
def test_integer_knobs_refuse_fractions(leg, match):
  with pytest.raises(ValueError, match=match) as e:
    make_pipeline(legs={'x': leg})
  _one_line(e)


# ---- templates -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
  'template, match',
  [
    ('plain', r"template 'plain' is neither a template name \(text, speaker, dated\) .*it has no \{field\}"),
    ('{txt}', r"template '\{txt\}' .*names unknown fields \['txt'\]"),
    ('{}', r"it names unknown fields \['\{\}'\]"),
    ('a {', r"template 'a \{' is not a str.format template"),
  ],
)
def test_a_locomo_template_without_fields_is_refused_before_reading(tmp_path, template, match):
  """``dataset.loader.template=plain`` rendered every item as the word "plain": every metric 0.0000."""
  from engram_jax.data import load_locomo

  with pytest.raises(ValueError, match=match) as e:
    load_locomo(tmp_path, template=template)  # no data there: refused before any file is read
  _one_line(e)


def test_a_longmemeval_template_without_fields_is_refused():
  from engram_jax.data import longmemeval

  with pytest.raises(ValueError, match=r"LongMemEval: template 'plain' .*it has no \{field\}") as e:
    longmemeval.load_longmemeval('/nonexistent', template='plain')
  _one_line(e)
  with pytest.raises(ValueError, match=r"names unknown fields \['text'\]"):
    longmemeval.load_longmemeval('/nonexistent', template='{role}: {text}')


# ---- the learning rate of a fit ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
  'override, match',
  [
    (
      'fit.optimizer.learning_rate.init_value=-0.5',
      r'init_value=-0.5.* must be a finite rate >= 0 at every step, got -0.5',
    ),
    (
      'fit.optimizer.learning_rate.init_value=nan',
      r'init_value=nan.* must be a finite rate >= 0 at every step, got nan',
    ),
    ('fit.optimizer.learning_rate.init_value=0', r'init_value=0.* is 0 at every one of the 60 steps'),
    ('fit.optimizer.learning_rate=-0.1', r'fit.optimizer.learning_rate must be a finite number > 0 .*got -0.1$'),
    ('fit.optimizer.learning_rate=0', r'fit.optimizer.learning_rate must be a finite number > 0 .*got 0$'),
  ],
)
def test_a_bad_learning_rate_is_refused_before_any_work(override, match):
  """A negative rate climbed the loss ("fitted" 0.1533 vs hand-set 0.2949), 0 reported an unmoved fit as fitted,
  NaN failed after 12 s blaming ``legs.cos.weight``."""
  with pytest.raises(ValueError, match=match) as e:
    checks.check_fit(_compose([override], name='fit'))
  _one_line(e)
  checks.check_fit(_compose(['fit.optimizer.learning_rate=0.05'], name='fit'))
  checks.check_fit(_compose(['fit.optimizer.learning_rate.alpha=0.0'], name='fit'))  # decays to 0 at the end: fine


# ---- the public operators check their inputs where make_pipeline does --------------------------------------------


def _unit(x):
  return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


DOCS = _unit(jax.random.normal(jax.random.key(0), (40, 16)))
QUERY = _unit(DOCS[3] + DOCS[7])


@pytest.mark.parametrize(
  'kwargs, match',
  [
    ({'lam': -1.0}, r'^cfsr_scores: lam must be > 0 \(ridge strength\), got -1.0$'),
    ({'lam': float('nan')}, r'^cfsr_scores: lam must be a finite number \(ridge strength\), got nan$'),
    ({'w': 2}, r'^cfsr_scores: w must be in \[0, 1\] \(blend weight\), got 2$'),
    ({'lam': jnp.asarray(-1.0)}, r'^cfsr_scores: lam must be > 0'),
    ({'pool': 0}, r'^cfsr_scores: pool must be an integer >= 1 \(cosine pool P\), got 0$'),
  ],
)
def test_cfsr_scores_checks_its_knobs(kwargs, match):
  """``cfsr_scores(q, docs, pool=20, lam=-1.0)`` (also lam=nan, w=2) ranked silently."""
  with pytest.raises(ValueError, match=match) as e:
    cfsr_scores(QUERY, DOCS, **{'pool': 20, **kwargs})
  _one_line(e)


def test_a_nan_query_and_an_empty_corpus_are_refused():
  """A NaN query gave all ``-inf`` (top_k then returned the last indices); an empty corpus ``ZeroDivisionError``."""
  with pytest.raises(ValueError, match=r'^cfsr_scores: query has 16 NaN or infinite value\(s\) of 16 ') as e:
    cfsr_scores(QUERY * jnp.nan, DOCS, pool=20)
  _one_line(e)
  with pytest.raises(ValueError, match=r'^cfsr_scores: docs has no items \(shape \(0, 16\)\): nothing to rank$') as e:
    cfsr_scores(QUERY, jnp.zeros((0, 16)), pool=20)
  _one_line(e)
  with pytest.raises(ValueError, match=r'^cosine_scores: docs has 16 NaN or infinite value\(s\) of 640 '):
    cosine_scores(QUERY, DOCS.at[5].set(jnp.inf))  # NumPy or jnp, any public dense operator
  with pytest.raises(ValueError, match=r'Shape mismatch: query \(16,\) and docs \(40, 8\) must share the last axis'):
    mmr_select(QUERY, DOCS[:, :8], k=3)


POS = jnp.arange(40)


@pytest.mark.parametrize(
  'call, match',
  [
    (lambda: cosine_scores(QUERY, np.zeros((0, 16), np.float32)), r'^cosine_scores: docs has no items'),
    (lambda: bm25_scores(jnp.ones(3), jnp.ones((2, 3)), b=1.5), r'^bm25_scores: b must be in \[0, 1\]'),
    (lambda: bm25_scores(jnp.ones(3) * jnp.nan, jnp.ones((2, 3))), r'^bm25_scores: query_tf has 3 NaN'),
    (lambda: mmr_select(QUERY, DOCS, k=3, lam=1.5), r'^mmr_select: lam must be in \[0, 1\]'),
    (lambda: mmr_select(QUERY, DOCS, k=2.5), r'^mmr_select: k must be an integer >= 1'),
    (lambda: soft_mmr_select(QUERY, DOCS, k=3, temperature=0.0), r'^soft_mmr_select: temperature must be > 0'),
    (lambda: cfs_select(QUERY, DOCS, k=3, sigma=-1.0), r'^cfs_select: sigma must be > 0 \(a Gaussian width\)'),
    (lambda: cfs_select(QUERY * jnp.nan, DOCS, k=3), r'^cfs_select: query has 16 NaN'),
    (lambda: soft_cfs_select(QUERY, DOCS, k=3, beta=float('inf')), r'^soft_cfs_select: beta must be a finite'),
    (
      lambda: tide_scores(jnp.ones(4), jnp.arange(4), weight=float('inf'), depth=3),
      r'^tide_scores: weight must be a fin',
    ),
    (lambda: tide_scores(jnp.ones(4), jnp.arange(4), weight=0.1, depth=0), r'^tide_scores: depth must be an integer'),
    (lambda: tide_scores(jnp.zeros(0), jnp.arange(0), weight=0.1, depth=3), r'^tide_scores: base has no items'),
    (lambda: perturbed_cosine(QUERY, DOCS, key=jax.random.key(0), eps=-0.1), r'^perturbed_cosine: eps must be >= 0'),
    (lambda: additive_fuse(jnp.ones(3), jnp.ones(3), jnp.array(2), threshold=2.0), r'^additive_fuse: threshold must'),
    (
      lambda: rrf_fuse(jnp.ones((2, 5)), weights=jnp.array([1.0, jnp.inf]), depths=[3, 3]),
      r'^rrf_fuse: weights\[1\] must be a finite number \(leg weights\), got inf$',
    ),
    (
      lambda: rrf_fuse(jnp.ones((2, 5)).at[0, 1].set(jnp.nan), weights=[1.0, 1.0], depths=[3, 3]),
      r'^rrf_fuse: leg_scores has 1 NaN or \+inf value',
    ),
    (lambda: rrf_fuse(jnp.ones((2, 5)), weights=[1.0, 1.0], depths=[3, 0]), r'^rrf_fuse: depths\[1\] must be an int'),
    (lambda: soft_rrf_fuse(jnp.ones((2, 5)), weights=[1.0, 1.0], depths=[3, 3], k0=-1.0), r'^soft_rrf_fuse: k0 must'),
    (lambda: tcfsr_prior_scores(QUERY, DOCS, POS, pool=5, gamma=float('nan')), r'^tcfsr_prior_scores: gamma must be'),
    (lambda: tcfsr_basis_scores(QUERY, DOCS, POS, pool=5, alpha=-1.0), r'^tcfsr_basis_scores: alpha must be >= 0'),
    (lambda: tcfsr_gated_scores(QUERY, DOCS, POS, pool=5, theta=2.0), r'^tcfsr_gated_scores: theta must be in'),
    (
      lambda: soft_tcfsr_gated_scores(QUERY, DOCS, POS, pool=5, temperature=0.0),
      r'^soft_tcfsr_gated_scores: temperature must be > 0',
    ),
    (
      lambda: tcfsr_learned_scores(DOCS[:2], DOCS, POS, jnp.zeros((2, 4)), weights=jnp.full(6, jnp.nan), pool=5),
      r'^tcfsr_learned_scores: weights\[0\] must be a finite number',
    ),
  ],
)
def test_every_public_operator_checks_its_inputs(call, match):
  with pytest.raises(ValueError, match=match) as e:
    call()
  _one_line(e)


def test_the_checks_vanish_under_jit_and_grad():
  """Traced values are not looked at (an invalid traced value is the caller's, as in any jitted code), and a
  concrete constant of a traced program is checked when it is traced, not traced into the program."""
  cfsr = lambda lam, q: cfsr_scores(q, DOCS, pool=5, iterations=3, lam=lam)
  program = str(jax.make_jaxpr(cfsr)(-1.0, QUERY))  # lam traced: not checked
  assert 'is_finite' not in program  # DOCS (concrete) was checked at trace time, outside the program
  jax.make_jaxpr(jax.grad(lambda lam: cfsr(lam, QUERY)[3]))(0.01)
  tide = lambda w: tide_scores(jnp.arange(4.0), jnp.arange(4), weight=w, depth=3)
  assert jax.jit(tide)(jnp.inf)[0] == -jnp.inf  # traced: the caller's value, unchecked (the item outside the top-3)
  assert float(jax.jit(jax.grad(lambda w: tide(w)[3]))(0.5)) == 1.0


# ---- evaluate: unit-norm embeddings --------------------------------------------------------------------------------


def _episode(n=40, dim=16, seed=0):
  from engram_jax.core.types import Episode, Item, Question

  rng = np.random.default_rng(seed)
  docs = rng.normal(size=(n, dim)).astype(np.float32)
  docs /= np.linalg.norm(docs, axis=-1, keepdims=True)
  items = tuple(Item(f'm{j}', f'memory {j}', 'S1', j) for j in range(n))
  ep = Episode('mine', items, (Question('q', 'what happened?', ('m3',), ('S1',), 1),))
  return ep, docs, docs[3:4].copy()


def test_evaluate_refuses_item_and_question_vectors_not_of_unit_norm():
  """Item vectors of norm 1..40 were accepted (recall@5 1.0 -> 0.0), although NaN was refused."""
  from engram_jax import evaluate

  ep, docs, query = _episode()
  pipes = {'cos': make_pipeline(legs={'cos': {'op': 'cosine'}})}
  run = lambda d, q, **kw: evaluate([ep], [(d, q)], pipes, k=5, metrics=['recall@5'], seed=0, progress=False, **kw)
  assert run(docs, query).scores['cos']['recall@5'].tolist() == [1.0]
  scaled = docs * np.linspace(1, 40, len(docs), dtype=np.float32)[:, None]
  with pytest.raises(
    ValueError, match=r'^Episode mine: item embeddings: 39 of 40 rows are not unit-norm \(worst: row 39, norm 40; '
  ) as e:
    run(scaled, query)
  _one_line(e)
  with pytest.raises(ValueError, match=r'^Episode mine: question embeddings: 1 of 1 rows are not unit-norm'):
    run(docs, query * 2)
  assert run(scaled, query, unit_norm=False).scores['cos']['recall@5'].tolist() == [0.0]  # declared: as asked


def test_the_hashing_embedder_gives_unit_vectors():
  from engram_jax.core.batch import NORM_TOL
  from engram_jax.data.embed import hashing_encoder

  vecs = np.asarray(hashing_encoder(dim=64)(['a dog', 'an overdue invoice', '', 'x' * 500]))
  assert np.all(np.abs(np.linalg.norm(vecs, axis=-1) - 1) < NORM_TOL)
