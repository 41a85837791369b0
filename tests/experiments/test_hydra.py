"""Every config composes and instantiates; the entry point runs end to end on one conversation."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from engram_jax.data import io
from engram_jax.eval import pipeline
from experiments import evaluate
from experiments.lib import common

CONF = str(Path(__file__).resolve().parents[2] / 'conf')
PIPELINES = sorted(p.stem for p in Path(CONF, 'pipeline').glob('*.yaml'))
EXPERIMENTS = sorted(p.stem for p in Path(CONF, 'experiment').glob('*.yaml'))
try:
  HAVE = (io.resolve_data_root() / 'locomo' / 'locomo10.json').is_file()
except FileNotFoundError:
  HAVE = False
real = pytest.mark.skipif(not HAVE, reason='LoCoMo not found under the data root')


def _compose(overrides=()):
  with initialize_config_dir(config_dir=CONF, version_base='1.3'):
    return compose(config_name='config', overrides=list(overrides))


def test_default_config_composes_the_default_pipelines():
  """The main job: cosine, the default lexical leg and its fusion, the seeds' BM25 and its fusion beside them."""
  cfg = _compose()
  assert list(cfg.pipeline) == ['cosine', 'bm25en', 'rrf_cos_bm25en', 'bm25', 'rrf_cos_bm25']
  assert cfg.eval.k == 10 and cfg.dataset.name == 'locomo'


@pytest.mark.parametrize('name', PIPELINES)
def test_every_pipeline_instantiates(name):
  cfg = _compose([f'pipeline=[{name}]'])
  pipes, tuned = common.build_pipelines(cfg)
  assert all(isinstance(p, pipeline.Pipeline) for p in pipes.values())
  assert name in pipes or name in tuned


@pytest.mark.parametrize('name', EXPERIMENTS)
def test_every_experiment_composes(name):
  cfg = _compose([f'experiment={name}'])
  assert common.build_pipelines(cfg)[0]


@pytest.mark.parametrize('group', ['embedder=hashing', 'embedder=minilm'])
def test_embedders_instantiate(group):
  cfg = _compose([group])
  assert callable(instantiate(cfg.embedder.encoder))


def test_unknown_pipeline_is_a_clear_error():
  with pytest.raises(Exception, match="Could not load 'pipeline/nope'"):
    _compose(['pipeline=[nope]'])


@pytest.mark.slow
@real
def test_run_writes_results_json(tmp_path):
  # eval.leg_cache_mb=0: an earlier test in this process may have left the same jitted programs in the in-process
  # leg cache (engram_jax.eval.legcache), and this test checks that compilations are counted
  cfg = _compose(
    [
      'embedder=hashing',
      'dataset.loader.conversations=[conv-30]',
      'eval.n_resamples=200',
      'eval.progress=false',
      f'paths.cache_dir={tmp_path}/cache',
      'eval.leg_cache_mb=0',
    ]
  )
  res = evaluate.run(cfg, tmp_path / 'out')
  saved = json.loads((tmp_path / 'out' / 'results.json').read_text())
  assert saved['dataset'] == 'locomo' and saved['n_questions'] == res['n_questions'] == 105
  for name in ['cosine', 'bm25', 'rrf_cos_bm25']:
    p = saved['pipelines'][name]
    assert 0 <= p['ndcg@10'] <= 1 and 0 <= p['recall@10'] <= 1
    assert p['ci95']['ndcg@10'][0] <= p['ndcg@10'] <= p['ci95']['ndcg@10'][1]
    assert 'single-hop (4)' in p['by_category']
  assert 'vs cosine' in saved['pipelines']['rrf_cos_bm25']['paired']
  assert len(saved['per_question']) == 105 and len(saved['per_question'][0]['retrieved']['bm25']) == 10
  assert (tmp_path / 'out' / 'results.md').read_text().startswith('### locomo')
  info = json.loads((tmp_path / 'out' / 'run_info.json').read_text())  # timing stays out of results.json
  assert info['timing']['phases_s']['retrieve'] > 0 and info['timing']['compile_requests'] >= 1
  assert 'timing' not in saved


@pytest.mark.slow
@real
def test_multirun_one_run_per_pipeline(tmp_path):
  cmd = [
    sys.executable,
    '-m',
    'experiments.evaluate',
    '-m',
    'pipeline=cosine,bm25',
    'embedder=hashing',
    'dataset.loader.conversations=[conv-30]',
    'eval.n_resamples=100',
    'eval.progress=false',
    f'paths.cache_dir={tmp_path}/cache',
    f'hydra.sweep.dir={tmp_path}/multi',
  ]
  subprocess.run(
    cmd,
    check=True,
    cwd=Path(__file__).resolve().parents[2],
    capture_output=True,
    env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
  )
  for i, name in enumerate(['cosine', 'bm25']):
    saved = json.loads((tmp_path / 'multi' / str(i) / 'results.json').read_text())
    assert list(saved['pipelines']) == [name]


@pytest.mark.slow
@real
def test_fitted_parameters_are_applied_per_episode(tmp_path):
  fitted = tmp_path / 'fitted.json'
  fitted.write_text(
    json.dumps(
      {
        'pipeline': 'rrf_cos_bm25',
        'folds': {'conv-30': {'legs.cos.weight': 0.0, 'legs.bm25.weight': 1.0}, 'conv-26': {'legs.cos.weight': 1.0}},
      }
    )
  )
  cfg = _compose(
    [
      'embedder=hashing',
      'dataset.loader.conversations=[conv-30,conv-26]',
      'eval.n_resamples=100',
      'eval.progress=false',
      f'paths.cache_dir={tmp_path}/cache',
      'pipeline=[bm25,rrf_cos_bm25]',
      f'fitted={fitted}',
    ]
  )
  res = evaluate.run(cfg, tmp_path / 'out')
  rows = res['per_question']
  conv30 = [r for r in rows if r['episode'] == 'conv-30']
  # with the cosine leg weighted 0, RRF over BM25 alone gives BM25's top-10 on conv-30
  assert all(r['retrieved']['rrf_cos_bm25'] == r['retrieved']['bm25'] for r in conv30)
  assert res['expanded']['rrf_cos_bm25']['variant_of_episode']['conv-26'] == 'rrf_cos_bm25[fold=conv-26]'
  bad = tmp_path / 'bad.json'
  bad.write_text(json.dumps({'pipeline': 'rrf_cos_bm25', 'folds': {'conv-30': {'legs.nope.weight': 1.0}}}))
  with pytest.raises(ValueError, match='does not exist'):
    common.build_pipelines(_compose(['pipeline=[rrf_cos_bm25]', f'fitted={bad}']))
  bad.write_text(json.dumps({'pipeline': 'rrf_cos_bm25', 'folds': {'conv-30': {'legs.0.weight': 1.0}}}))
  with pytest.raises(ValueError, match="episode conv-30: .*no leg '0'.*does not exist"):  # the old positional form
    common.build_pipelines(_compose(['pipeline=[rrf_cos_bm25]', f'fitted={bad}']))


@pytest.mark.parametrize('name', ['cfs_table', 'cfsr_table', 'tide_table'])
def test_experiment_files_set_their_reference_and_pipelines(name):
  cfg = _compose([f'experiment={name}'])
  assert cfg.reference and cfg.reference_label.startswith('published')
  assert set(cfg.reference) <= set(cfg.pipeline)
