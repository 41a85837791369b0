"""Issue 41's probes of silent wrong numbers and crashes in the statistics, the config values and the public
operators: each a one-line error before any work (each test fails on the code before the fix)."""

import json
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from engram_jax import make_pipeline
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
  with pytest.raises(
    ValueError, match=rf'leg c: weight must be >= 0 and finite \(fusion weight\), got {value}'
  ) as e:
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
