"""experiments.collect: one table of a Hydra multirun's jobs x pipelines, paired tests against one row; a real
sweep run by each installed launcher collects to the same table."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tiny_data
import yaml

from engram_jax.core import runfolder
from engram_jax.data import io
from engram_jax.metrics import stats
from experiments import collect

ROOT = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(0)
QIDS = [f'conv-1/q{i}' for i in range(40)]


def _job(folder, num, overrides, per_pipeline, *, k=10, qids=QIDS, wall=1.0):
  """A fake finished job: ``.hydra/overrides.yaml``, ``results.json`` (summary + per-question ndcg/hit at ``k``)
  and ``run_info.json``; ``per_pipeline`` maps a pipeline to its per-question ndcg values."""
  job = folder / str(num)
  (job / '.hydra').mkdir(parents=True)
  (job / '.hydra' / 'overrides.yaml').write_text(yaml.safe_dump(list(overrides)))
  if per_pipeline is None:
    return job
  metrics = [f'ndcg@{k}', f'hit@{k}']
  summary = {}
  for name, v in per_pipeline.items():
    ci = stats.bootstrap_ci(v, seed=1, n_resamples=200)
    summary[name] = {
      metrics[0]: ci.mean,
      metrics[1]: float(np.mean(v > 0.5)),
      'ci95': {metrics[0]: [ci.lo, ci.hi], metrics[1]: [0.0, 1.0]},
    }
  rows = [
    {'id': q, 'scores': {n: {metrics[0]: float(v[i]), metrics[1]: float(v[i] > 0.5)} for n, v in per_pipeline.items()}}
    for i, q in enumerate(qids)
  ]
  (job / 'results.json').write_text(
    json.dumps({'k': k, 'metrics': metrics, 'pipelines': summary, 'per_question': rows})
  )
  (job / 'run_info.json').write_text(json.dumps({'timing': {'wall_s': wall}}))
  runfolder.mark(job, ['results.json', 'run_info.json'])  # a finished job's marker, as experiments.evaluate writes
  return job


def _sweep(tmp_path):
  a, b, c = (RNG.uniform(size=len(QIDS)) for _ in range(3))
  common = ['embedder=hashing']
  _job(tmp_path, 0, ['pipeline=[cosine]', 'eval.k=5'] + common, {'cosine': a}, k=5)
  _job(tmp_path, 1, ['pipeline=[bm25,rrf]', 'eval.k=5'] + common, {'bm25': b, 'rrf': c}, k=5)
  _job(tmp_path, 2, ['pipeline=[cosine]', 'eval.k=10'] + common, {'cosine': a + 0.0}, k=10)
  return a, b, c


def test_one_row_per_job_and_pipeline_labelled_by_what_varies(tmp_path):
  a, b, c = _sweep(tmp_path)
  table = collect.main([str(tmp_path), '--n-resamples', '300'])
  rows = table['rows']
  assert [(r['job'], r['pipeline'], r['metric']) for r in rows] == [
    ('0', 'cosine', 'ndcg@5'),
    ('1', 'bm25', 'ndcg@5'),
    ('1', 'rrf', 'ndcg@5'),
    ('2', 'cosine', 'ndcg@10'),
  ]
  assert rows[1]['label'] == 'pipeline=[bm25,rrf] eval.k=5'  # embedder=hashing is common: left out
  assert table['reference'] == {
    'job': '0',
    'label': 'pipeline=[cosine] eval.k=5',
    'pipeline': 'cosine',
    'metric': 'ndcg@5',
  }
  assert rows[0]['vs_reference'] is None and table['same_questions'] and table['metric'] == 'ndcg'
  for row, v in zip(rows[1:], [b, c, a]):
    want = stats.paired_test(v, a, seed=20261008, n_resamples=300).to_dict()
    assert row['vs_reference'] == pytest.approx(want)  # batched == one pair alone
  assert rows[3]['vs_reference']['delta'] == 0 and rows[3]['vs_reference']['p'] == 1
  assert rows[1]['mean'] == pytest.approx(b.mean()) and rows[1]['n'] == len(QIDS)
  saved = json.loads((tmp_path / 'collect.json').read_text())
  assert saved == json.loads(json.dumps(table)) and saved['timing']['wall_s'] == {'0': 1.0, '1': 1.0, '2': 1.0}
  md = (tmp_path / 'collect.md').read_text()
  assert '| 1 | pipeline=[bm25,rrf] eval.k=5 | rrf | ndcg@5 | 40 |' in md and 'reference' in md


def test_reference_by_number_by_overrides_and_pipeline(tmp_path):
  a, b, c = _sweep(tmp_path)
  t = collect.collect(tmp_path, against='1', against_pipeline='rrf', metric='ndcg', n_resamples=200)
  assert t['reference']['pipeline'] == 'rrf'
  assert t['rows'][0]['vs_reference']['delta'] == pytest.approx(np.mean(a - c))
  t = collect.collect(tmp_path, against='eval.k=10', n_resamples=200)
  assert t['reference']['job'] == '2'
  with pytest.raises(ValueError, match=r"matches jobs \['0', '2'\]"):
    collect.collect(tmp_path, against='pipeline=[cosine]')
  with pytest.raises(ValueError, match="no pipeline 'nope'"):
    collect.collect(tmp_path, against='0', against_pipeline='nope')


def test_binary_metric_gets_mcnemar_and_exact_names_may_be_missing(tmp_path):
  _sweep(tmp_path)
  t = collect.collect(tmp_path, metric='hit', n_resamples=200)
  assert all('mcnemar_p' in r['vs_reference'] for r in t['rows'][1:])
  t = collect.collect(tmp_path, metric='ndcg@10', n_resamples=200)  # only job 2 scored it
  assert [r['job'] for r in t['rows']] == ['2']
  assert [m['job'] for m in t['missing']] == ['0', '1']


def test_question_sets_that_differ_are_paired_on_the_shared_ones(tmp_path):
  a, b = RNG.uniform(size=len(QIDS)), RNG.uniform(size=30)
  _job(tmp_path, 0, ['pipeline=[cosine]'], {'cosine': a})
  _job(tmp_path, 1, ['pipeline=[bm25]'], {'bm25': b}, qids=QIDS[10:])
  _job(tmp_path, 2, ['pipeline=[mmr]'], None)  # failed: no results.json
  t = collect.main([str(tmp_path), '--n-resamples', '200'])
  assert not t['same_questions']
  test = t['rows'][1]['vs_reference']
  assert test['n'] == 30 and test['delta'] == pytest.approx(np.mean(b - a[10:]))
  assert t['missing'] == [{'job': '2', 'label': 'pipeline=[mmr]', 'why': 'no results.json (failed or running)'}]
  assert '(n=30)' not in (tmp_path / 'collect.md').read_text()  # the row has 30 questions itself
  assert 'job 2 (pipeline=[mmr]): no results.json' in (tmp_path / 'collect.md').read_text()


def test_not_a_multirun_folder_is_a_clear_error(tmp_path):
  with pytest.raises(ValueError, match='no job folders'):
    collect.collect(tmp_path)


# ------------------------------------------------------------------------------------------------
# A real sweep, launched by each installed launcher

try:
  HAVE = (io.resolve_data_root() / 'locomo' / 'locomo10.json').is_file()
except FileNotFoundError:
  HAVE = False
LAUNCHERS = ['basic'] + [
  name
  for name, module in [
    ('parallel', 'hydra_plugins.hydra_joblib_launcher'),
    ('slurm_local', 'hydra_plugins.hydra_submitit_launcher'),
    ('ray_local', 'hydra_plugins.hydra_ray_launcher'),
  ]
  if importlib.util.find_spec(module) is not None
]


PLUGINS = {
  'parallel': 'hydra_plugins.hydra_joblib_launcher',
  'slurm': 'hydra_plugins.hydra_submitit_launcher',
  'slurm_local': 'hydra_plugins.hydra_submitit_launcher',
  'ray_local': 'hydra_plugins.hydra_ray_launcher',
}
TARGETS = {
  'parallel': 'JoblibLauncher',
  'slurm': 'SlurmLauncher',
  'slurm_local': 'LocalLauncher',
  'ray_local': 'RayLauncher',
}


@pytest.mark.parametrize('name', sorted(p.stem for p in (ROOT / 'conf' / 'hydra' / 'launcher').glob('*.yaml')))
def test_project_launcher_configs_extend_the_plugins(name):
  """Each conf/hydra/launcher file composes on top of its plugin's own config (its schema and target kept)."""
  pytest.importorskip(PLUGINS[name])
  from hydra import compose, initialize_config_dir

  with initialize_config_dir(config_dir=str(ROOT / 'conf'), version_base='1.3'):
    cfg = compose(config_name='config', overrides=[f'hydra/launcher={name}'], return_hydra_config=True)
  launcher = cfg.hydra.launcher
  assert launcher._target_.endswith(TARGETS[name])
  assert {
    'parallel': lambda: launcher.n_jobs == 2,
    'slurm': lambda: launcher.timeout_min == 240,
    'slurm_local': lambda: launcher.timeout_min == 240,
    'ray_local': lambda: launcher.ray.remote.num_cpus == 2,
  }[name]()


@pytest.mark.slow
@pytest.mark.skipif(not HAVE, reason='LoCoMo not found under the data root')
def test_every_launcher_collects_the_same_table(tmp_path):
  """``pipeline=[cosine],[bm25]`` x ``eval.k=5,10`` on two cut LoCoMo conversations (hashing embedder), run by the
  basic launcher and by the project's launcher configs whose plugin is installed (``parallel``: joblib, 2 workers;
  ``slurm_local``: submitit's local executor, all jobs at once; ``ray_local``), into one shared embedding cache
  and, per sweep, a cold compilation cache shared by its jobs: every sweep collects to the same table."""
  data = tmp_path / 'data'
  tiny_data.write_locomo(io.resolve_data_root(), data)
  tables = {}
  for launcher in LAUNCHERS:
    sweep = tmp_path / launcher
    cmd = [
      sys.executable,
      '-m',
      'experiments.evaluate',
      '-m',
      'pipeline=[cosine],[bm25]',
      'eval.k=5,10',
      'eval.metrics=[ndcg@${eval.k},recall@${eval.k}]',
      'embedder=hashing',
      'eval.n_resamples=200',
      'eval.progress=false',
      f'paths.data_root={data}',
      f'paths.cache_dir={tmp_path}/cache',
      f'paths.compile_cache_dir={sweep}_jax',
      f'hydra.sweep.dir={sweep}',
      f'hydra/launcher={launcher}',
    ]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
    table = collect.main([str(sweep), '--against', 'pipeline=[cosine] eval.k=10', '--n-resamples', '300'])
    assert [(r['label'], r['metric']) for r in table['rows']] == [
      ('pipeline=[cosine] eval.k=5', 'ndcg@5'),
      ('pipeline=[cosine] eval.k=10', 'ndcg@10'),
      ('pipeline=[bm25] eval.k=5', 'ndcg@5'),
      ('pipeline=[bm25] eval.k=10', 'ndcg@10'),
    ]
    assert table['same_questions'] and table['missing'] == [] and len(table['timing']['wall_s']) == 4
    tables[launcher] = {k: v for k, v in table.items() if k != 'timing'}
  assert all(t == tables['basic'] for t in tables.values()), list(tables)
