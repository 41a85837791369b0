"""``python -m experiments.evaluate ... +grid=...`` on two cut LoCoMo conversations (hashing embedder): one process
writes grid.npz / grid.md / grid.json / grid.png, knobs by full path, and a point equals a separate run's results."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tiny_data

from engram_jax.data import io
from engram_jax.eval import grid

ROOT = Path(__file__).resolve().parents[2]
HAVE = (io.resolve_data_root() / 'locomo' / 'locomo10.json').is_file()


@pytest.mark.slow
@pytest.mark.skipif(not HAVE, reason='LoCoMo not found under the data root')
def test_grid_command_writes_its_files_and_equals_a_separate_run(tmp_path):
  data = tmp_path / 'data'
  tiny_data.write_locomo(io.resolve_data_root(), data)
  common = [
    sys.executable,
    '-m',
    'experiments.evaluate',
    'pipeline=[rrf_cos_bm25]',
    'embedder=hashing',
    'eval.n_resamples=200',
    'eval.progress=false',
    f'paths.data_root={data}',
    f'paths.cache_dir={tmp_path}/cache',
  ]
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
  out = tmp_path / 'grid'
  spelled = '+grid={legs.cos.weight: [0.5, 2], legs.bm25.weight: [1, 3], k0: [20, 60]}'
  subprocess.run([*common, spelled, f'hydra.run.dir={out}'], check=True, cwd=ROOT, capture_output=True, env=env)
  assert {p.name for p in out.iterdir()} >= {'grid.npz', 'grid.md', 'grid.json', 'grid.png', 'run_info.json'}
  res = grid.load_npz(out / 'grid.npz')
  assert res.paths == ['legs.cos.weight', 'legs.bm25.weight', 'k0'] and res.n_points == 8
  table = (out / 'grid.md').read_text()
  assert '| legs.cos.weight | legs.bm25.weight | k0 |' in table
  point = 5  # cos weight 2.0, bm25 weight 1.0, k0 60
  assert res.point(point) == {'legs.cos.weight': 2.0, 'legs.bm25.weight': 1.0, 'k0': 60.0}
  one = tmp_path / 'one'
  subprocess.run(
    [
      *common,
      '++pipeline.rrf_cos_bm25.legs.cos.weight=2.0',
      'pipeline.rrf_cos_bm25.k0=60',
      f'hydra.run.dir={one}',
    ],
    check=True,
    cwd=ROOT,
    capture_output=True,
    env=env,
  )
  results = json.loads((one / 'results.json').read_text())
  assert [r['id'] for r in results['per_question']] == res.question_ids
  for metric in results['metrics']:
    want = np.array([r['scores']['rrf_cos_bm25'][metric] for r in results['per_question']])
    np.testing.assert_array_equal(res.scores[metric][point], want)


def test_grid_figure_puts_every_knob_on_an_axis():
  """Eight knobs (28 pairs): disjoint neighbours, every knob by its full path on exactly one heatmap axis."""
  import itertools

  from experiments.lib import grid as grid_lib

  paths = [f'legs.l{i}.weight' for i in range(7)] + ['k0']
  rows = list(itertools.product([1.0, 2.0], repeat=len(paths)))
  rng = np.random.default_rng(0)
  res = grid.GridResult(
    'p',
    paths,
    {p: np.array([r[i] for r in rows]) for i, p in enumerate(paths)},
    ['q0', 'q1'],
    ['e', 'e'],
    [1, 1],
    {'ndcg@10': rng.random((len(rows), 2))},
    {},
    10,
    {},
  )
  ranked = grid.rank_points(res, 'ndcg@10', seed=0, n_resamples=100, top=5)
  fig = grid_lib.plot(res, ranked, metric='ndcg@10')
  labels = [l for ax in fig.axes[1:] for l in (ax.get_xlabel(), ax.get_ylabel()) if l]
  assert sorted(labels) == sorted(paths)


def _small_grid():
  paths = ['legs.cos.weight', 'legs.bm25.weight', 'k0']
  rows = [(a, b, c) for a in (0.5, 1.0, 2.0) for b in (1.0, 2.0) for c in (20.0, 60.0)]
  rng = np.random.default_rng(1)
  return grid.GridResult(
    'p',
    paths,
    {p: np.array([r[i] for r in rows]) for i, p in enumerate(paths)},
    [f'q{i}' for i in range(40)],
    ['e'] * 40,
    [1] * 40,
    {'ndcg@10': rng.random((len(rows), 40))},
    {},
    10,
    {},
  )


def test_the_figure_process_draws_the_same_png(tmp_path):
  """The helper process (:class:`FigureWorker`) writes the bytes :func:`plot` writes in the job's own process."""
  from experiments.lib import grid as grid_lib
  from experiments.lib import grid_figure

  res = _small_grid()
  ranked = grid.rank_points(res, 'ndcg@10', seed=0, n_resamples=200, top=6)
  grid_lib.plot(res, ranked, metric='ndcg@10', path=tmp_path / 'here.png')
  worker = grid_figure.FigureWorker()
  try:
    worker.slices(grid_lib.view(res, 'ndcg@10'))
    worker.finish(ranked, tmp_path / 'there.png')
    worker.wait()
  finally:
    worker.close()
  assert (tmp_path / 'there.png').read_bytes() == (tmp_path / 'here.png').read_bytes()


def test_a_failing_figure_process_raises_its_error(tmp_path):
  """A helper that fails (here: a ranking whose best point is not the slices' best) is an error naming the cause,
  not a missing file; a helper stopped before its figure leaves nothing behind."""
  from experiments.lib import grid as grid_lib
  from experiments.lib import grid_figure

  res = _small_grid()
  ranked = grid.rank_points(res, 'ndcg@10', seed=0, n_resamples=200, top=6)
  ranked[0] = {**ranked[0], 'point': ranked[1]['point']}
  worker = grid_figure.FigureWorker()
  try:
    worker.slices(grid_lib.view(res, 'ndcg@10'))
    worker.finish(ranked, tmp_path / 'bad.png')
    with pytest.raises(RuntimeError, match='the slices and the ranking disagree'):
      worker.wait()
  finally:
    worker.close()
  assert not (tmp_path / 'bad.png').exists()
  idle = grid_figure.FigureWorker()
  idle.close()
  assert idle.proc.returncode is not None
