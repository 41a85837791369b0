"""Config validation before any work: each bad option is a one-line error naming it and the allowed values;
options that used to be ignored silently are either honoured or refused."""

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from engram_jax import fit
from engram_jax.data import io, splits
from engram_jax.data.locomo import load_locomo
from engram_jax.eval import pipeline
from engram_jax.ops import cosine
from experiments import evaluate
from experiments.lib import checks, common

CONF = str(Path(__file__).resolve().parents[2] / 'conf')
try:
  HAVE = (io.resolve_data_root() / 'locomo' / 'locomo10.json').is_file()
except FileNotFoundError:
  HAVE = False
real = pytest.mark.skipif(not HAVE, reason='LoCoMo not found under the data root')


def _compose(overrides=(), name='config'):
  with initialize_config_dir(config_dir=CONF, version_base='1.3'):
    return compose(config_name=name, overrides=list(overrides))


@pytest.mark.parametrize(
  'overrides, match',
  [
    (
      ['eval.baselines=[nope]'],
      r"eval.baselines names \['nope'\].*allowed: \['cosine', 'bm25en', 'rrf_cos_bm25en', 'bm25', 'rrf_cos_bm25'\]",
    ),
    (['pipeline=[cosine]', 'eval.baselines=[rrf_cos_bm25]'], 'eval.baselines names'),
    (
      ['eval.metrics=[answer@10]'],
      r"dataset locomo: metric 'answer@10' cannot be computed.*\['field_session_recall_any', 'parent_recall'\]",
    ),
    (['eval.metrics=[ndcg@20]'], r"metric 'ndcg@20' needs cutoff 20, but eval.k=10"),
    (['eval.metrics=[nope@3]'], r"unknown metric 'nope@3'; allowed"),
    (['eval.metrics=[]'], 'no metrics given'),
    (['eval.k=0'], 'eval.k must be an integer >= 1'),
    (['experiment=tide_table', 'eval.metrics=[ndcg@10]'], 'eval.metrics applies to one-dataset runs'),
    (['dataset=longmemeval_s', 'dataset.loader.part=pilott'], r"dataset.loader.part must be one of \['all'"),
    (
      ['dataset=longmemeval_s', 'dataset.loader.part=train', 'dataset.loader.n_train=0'],
      'dataset.loader.n_train must be >= 1',
    ),
    (
      ['pipeline=[tide_dense]', 'pipeline.tide_dense.tune.train=[nope]'],
      r"tune.train names 'nope'; allowed: \['fc_mh_train', 'fc_sh_train', 'lme_train'\]",
    ),
    (['pipeline=[tide_dense]', 'train_sets.lme_train.loader.n_train=0'], 'train_sets.lme_train.loader.n_train'),
  ],
)
def test_bad_evaluate_options_are_one_line_errors(overrides, match):
  with pytest.raises(ValueError, match=match) as e:
    checks.check_evaluate(_compose(overrides))
  assert '\n' not in str(e.value)


@pytest.mark.parametrize(
  'overrides, match',
  [
    (
      ['pipeline=[rrf_cos_bm25_cfs]', '+pipeline.rrf_cos_bm25_cfs.legs.cfs.sigma=-0.1'],
      r'pipeline rrf_cos_bm25_cfs, leg cfs: sigma must be > 0 \(a Gaussian width\), got -0.1',
    ),
    (['pipeline=[rrf_cos_bm25_cfs]', '+pipeline.rrf_cos_bm25_cfs.legs.cfs.beta=0'], 'beta must be > 0'),
    (['pipeline=[bm25]', '+pipeline.bm25.legs.bm25.b=1.5'], r'b must be in \[0, 1\]'),
    (['pipeline=[bm25]', '+pipeline.bm25.legs.bm25.k1=0'], 'k1 must be > 0'),
    (['pipeline=[cfsr]', '+pipeline.cfsr.legs.cfsr.w=2'], r'w must be in \[0, 1\]'),
    (['pipeline=[cfsr]', '+pipeline.cfsr.legs.cfsr.lam=-1'], 'lam must be > 0'),
    (['pipeline=[cfsr]', '+pipeline.cfsr.legs.cfsr.pool=0'], 'pool must be an integer >= 1'),
    (['pipeline=[rrf_cos_bm25]', 'pipeline.rrf_cos_bm25.k0=0'], 'k0 must be > 0'),
    (['pipeline=[rrf_cos_bm25]', '+pipeline.rrf_cos_bm25.legs.cos.depth=0'], 'depth must be an integer >= 1'),
    (['pipeline=[rrf_cos_bm25]', '+pipeline.rrf_cos_bm25.legs.cos.weight=-1'], 'weight must be >= 0'),
    (['pipeline=[bm25]', '+pipeline.bm25.legs.bm25.nope=1'], r'pipeline bm25, leg bm25: operator bm25 has no knob'),
    (['pipeline=[bm25]', 'pipeline.bm25.legs.bm25.op=nope'], r"pipeline bm25, unknown operator 'nope'"),
  ],
)
def test_bad_knobs_are_refused_when_the_pipeline_is_built(overrides, match):
  with pytest.raises(ValueError, match=match) as e:
    common.build_pipelines(_compose(overrides))
  assert '\n' not in str(e.value)


def test_mmr_lam_is_a_trade_off_in_unit_interval():
  leg = pipeline.make_pipeline(legs={'cos': {'op': 'cosine'}}).legs[0]
  assert leg.op == 'cosine' and leg.score.func is cosine.cosine_leg and leg.score.keywords == {}
  with pytest.raises(ValueError, match=r'lam must be in \[0, 1\] \(MMR'):
    pipeline.make_pipeline(legs={'mmr': {'op': 'mmr', 'lam': 1.5}}, name='m')


@pytest.mark.parametrize(
  'overrides, match',
  [
    (['fit.temperatures.rank=0'], r'fit.temperatures.rank must be a number > 0, got 0'),
    (['fit.temperatures.final=-1'], 'fit.temperatures.final must be a number > 0'),
    (['fit.split=random'], r"fit.split must be one of \['crossfit', 'holdout', 'parts'\]"),
    (['fit.split=parts'], r'fit.split=parts fits on fit.train'),
    (['fit.split=holdout', 'fit.n_test=0'], 'fit.n_test must be an integer >= 1'),
    (['fit.folds=1'], 'fit.folds must be an integer >= 2'),
    (['fit.steps=0'], 'fit.steps must be an integer >= 1'),
    (['fit.anneal=[1.0,0.0]'], r'fit.anneal.end must be a number > 0, got 0'),
    (['fit.anneal=[1.0]'], r'fit.anneal must be \[start, end\]'),
    (['fit.gap_checks=-1'], 'fit.gap_checks must be an integer >= 0'),
    (['pipeline=[cosine]'], 'nothing to fit'),
  ],
)
def test_bad_fit_options_are_one_line_errors(overrides, match):
  with pytest.raises(ValueError, match=match) as e:
    checks.check_fit(_compose(overrides, name='fit'))
  assert '\n' not in str(e.value)


def test_temperatures_are_checked_in_the_library_too():
  with pytest.raises(ValueError, match='fit.temperatures.greedy must be a number > 0'):
    fit.Temperatures(greedy=0.0)


@pytest.mark.parametrize('n_test', [0, 3, 4])
def test_holdout_needs_both_sides_non_empty(n_test):
  with pytest.raises(ValueError, match=r'fit.n_test must be between 1 and 2'):
    fit.holdout_split(['a', 'b', 'c'], n_test=n_test)
  assert fit.holdout_split(['a', 'b', 'c'], n_test=2)[0]


def test_default_baselines_are_those_in_the_run():
  assert checks.resolve_baselines(_compose()) == ['cosine', 'rrf_cos_bm25']
  assert checks.resolve_baselines(_compose(['pipeline=[bm25,cosine]'])) == ['cosine']
  assert checks.resolve_baselines(_compose(['pipeline=[bm25]'])) == []
  assert checks.resolve_baselines(_compose(['eval.baselines=[bm25]'])) == ['bm25']


def test_every_experiment_passes_the_checks():
  for p in sorted(Path(CONF, 'experiment').glob('*.yaml')):
    checks.check_evaluate(_compose([f'experiment={p.stem}']))


def _copied_root(tmp_path: Path) -> Path:
  """A data root whose LoCoMo file holds conv-30, conv-26 and conv-30 again under the new id conv-30-copy."""
  data = json.loads((io.resolve_data_root() / 'locomo' / 'locomo10.json').read_text())
  keep = {s['sample_id']: s for s in data if s['sample_id'] in ('conv-30', 'conv-26')}
  copy = dict(keep['conv-30'], sample_id='conv-30-copy')
  (tmp_path / 'locomo').mkdir(parents=True)
  (tmp_path / 'locomo' / 'locomo10.json').write_text(json.dumps([keep['conv-30'], keep['conv-26'], copy]))
  return tmp_path


@real
def test_a_copied_conversation_cannot_train_and_score(tmp_path):
  root = _copied_root(tmp_path / 'data')
  episodes, _ = load_locomo(root)
  with pytest.raises(ValueError, match='conv-30 and conv-30-copy have the same corpus'):
    splits.assert_distinct_episodes(episodes)
  train = [e for e in episodes if e.id != 'conv-30']
  with pytest.raises(ValueError, match='same corpus|overlap'):
    splits.assert_disjoint_content(train, [e for e in episodes if e.id == 'conv-30'])
  from experiments import fit as fit_exp

  cfg = _compose(
    [
      'embedder=hashing',
      f'paths.data_root={root}',
      'pipeline=rrf_cos_bm25',
      'fit.folds=3',
      'fit.steps=1',
      'fit.batch_size=8',
      'eval.n_resamples=100',
      'eval.progress=false',
      'fit.baselines=[cosine]',
      f'paths.cache_dir={tmp_path}/cache',
    ],
    name='fit',
  )
  with pytest.raises(ValueError, match='overlap|same corpus'):
    fit_exp.run(cfg, tmp_path / 'out')
  cfg = _compose(
    [
      'embedder=hashing',
      f'paths.data_root={root}',
      'pipeline=[rrf_cos_bm25_mmr_tuned]',
      'eval.n_resamples=100',
      'eval.progress=false',
      f'paths.cache_dir={tmp_path}/cache',
    ]
  )
  with pytest.raises(ValueError, match='same corpus'):  # cross-fitted tuning by episode
    evaluate.run(cfg, tmp_path / 'out2')


@real
@pytest.mark.parametrize('n_test', [0, 2])
def test_fit_holdout_with_an_empty_side_fails_before_training(tmp_path, n_test):
  from experiments import fit as fit_exp

  cfg = _compose(
    [
      'embedder=hashing',
      'dataset.loader.conversations=[conv-30,conv-26]',
      'pipeline=rrf_cos_bm25',
      'fit.split=holdout',
      f'fit.n_test={n_test}',
      'fit.steps=1',
      'fit.batch_size=8',
      'eval.n_resamples=100',
      'eval.progress=false',
      f'paths.cache_dir={tmp_path}/cache',
    ],
    name='fit',
  )
  with pytest.raises(ValueError, match='fit.n_test must be'):
    fit_exp.run(cfg, tmp_path / 'out')


@pytest.mark.slow
@real
def test_eval_metrics_override_is_honoured(tmp_path):
  cfg = _compose(
    [
      'embedder=hashing',
      'dataset.loader.conversations=[conv-30]',
      'eval.n_resamples=100',
      'eval.progress=false',
      'pipeline=[bm25]',
      'eval.metrics=[ndcg@5,mrr@10]',
      f'paths.cache_dir={tmp_path}/cache',
    ]
  )
  res = evaluate.run(cfg, tmp_path / 'out')
  assert res['metrics'] == ['ndcg@5', 'mrr@10'] and 'mrr@10' in res['pipelines']['bm25']


@pytest.mark.parametrize(
  'overrides, match',
  [
    (['+grd={k0: [20, 60]}'], r'unknown option grd \(did you mean grid\?\): no part of the program reads it'),
    (['+eval.nresamples=100'], r'unknown option eval.nresamples \(did you mean eval.n_resamples\?\)'),
    (['+typo=1'], r'unknown option typo'),
    (['reader=smollm2'], r'reader=smollm2: dataset locomo declares no answer task.*locomo_answer'),
    (['dataset=longmemeval_s', 'reader=smollm2'], r'dataset longmemeval_s declares no answer task'),
    (['dataset=locomo_answer', 'reader=smollm2', 'reader.questions=0'], r'reader.questions must be an integer >= 1'),
  ],
)
def test_options_nobody_reads_and_reader_mistakes_are_refused_before_loading(overrides, match):
  """The probes: `+grid=...` (before the grid existed; now `+grd`, its typo) and the typo `+eval.nresamples=100` ran the default job and exited 0;
  `reader=` on a dataset without an answer task failed after retrieval."""
  with pytest.raises(ValueError, match=match) as e:
    checks.check_evaluate(_compose(overrides))
  assert '\n' not in str(e.value)


def test_fit_refuses_unknown_keys_too():
  with pytest.raises(ValueError, match='unknown option eval.nresamples'):
    checks.check_fit(_compose(['+eval.nresamples=100'], name='fit'))


def _eps(sizes):
  from engram_jax.core.types import Episode, Item, Question

  return [
    Episode(
      id=f'e{i}',
      items=tuple(Item(id=f'e{i}-{j}', text=f'item {j}', parent='s', position=j) for j in range(n)),
      questions=(Question(id=f'q{i}', text='what?', gold=(f'e{i}-0',), gold_parents=('s',), category=1),),
    )
    for i, n in enumerate(sizes)
  ]


def test_checks_on_loaded_data_run_before_embedding(tmp_path):
  """k larger than an episode, reader.questions above the questions, a fitted= file missing episodes: refused by
  check_loaded (called by evaluate right after loading, before embedding)."""
  eps = _eps([30, 7, 40])
  with pytest.raises(ValueError, match=r'eval.k=10 is larger than episode e1 \(7 items; 1 episode\(s\)'):
    checks.check_loaded(_compose(), 'locomo', eps)
  checks.check_loaded(_compose(['eval.k=7', 'eval.metrics=[ndcg@5]']), 'locomo', eps)
  with pytest.raises(ValueError, match=r'reader.questions must be in 1..3'):
    checks.check_loaded(
      _compose(['dataset=locomo_answer', 'reader=smollm2', 'reader.questions=4', 'eval.k=5']), 'x', eps
    )
  fitted = tmp_path / 'fitted.json'
  fitted.write_text(json.dumps({'pipeline': 'cosine', 'folds': {'e0': {}, 'e2': {}}}))
  with pytest.raises(ValueError, match=r'no fitted parameters for episodes e1 of dataset locomo'):
    checks.check_loaded(_compose([f'fitted={fitted}', 'eval.k=5']), 'locomo', eps)
  with pytest.raises(ValueError, match=r'fitted=/nonexistent.json: not a readable fitted.json'):
    checks.check_evaluate(_compose(['fitted=/nonexistent.json']))


def test_entry_point_prints_one_line_and_the_traceback_on_request(tmp_path):
  import os
  import subprocess
  import sys

  cmd = [sys.executable, '-m', 'experiments.evaluate', '+eval.nresamples=100', f'hydra.run.dir={tmp_path}']
  out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, 'ENGRAM_FULL_ERROR': ''})
  assert out.returncode == 1
  assert (
    out.stderr.strip().splitlines() == [out.stderr.strip()] and 'Error: unknown option eval.nresamples' in out.stderr
  )
  out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, 'ENGRAM_FULL_ERROR': '1'})
  assert out.returncode == 1 and 'Traceback' in out.stderr
