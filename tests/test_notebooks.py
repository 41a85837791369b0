"""Notebooks run headless on a tiny evaluation (hashing embedder, one LoCoMo conversation) and are committed with
their outputs stripped."""

import json
import os
from pathlib import Path

import nbformat
import pytest
from hydra import compose, initialize_config_dir

from engram_jax.data import io

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / 'notebooks').glob('*.ipynb'))
try:
  HAVE = (io.resolve_data_root() / 'locomo' / 'locomo10.json').is_file()
except FileNotFoundError:
  HAVE = False


@pytest.mark.parametrize('path', NOTEBOOKS, ids=lambda p: p.name)
def test_outputs_are_stripped(path):
  nb = nbformat.read(path, as_version=4)
  for cell in nb.cells:
    if cell.cell_type == 'code':
      assert not cell.outputs and cell.execution_count is None, f'{path.name}: clear outputs before committing'


def _run(tmp_path, out, overrides):
  from experiments import evaluate

  with initialize_config_dir(config_dir=str(ROOT / 'conf'), version_base='1.3'):
    cfg = compose(
      config_name='config',
      overrides=[
        'embedder=hashing',
        'dataset.loader.conversations=[conv-30]',
        'eval.n_resamples=200',
        'eval.progress=false',
        f'paths.cache_dir={tmp_path}/cache',
        *overrides,
      ],
    )
  evaluate.run(cfg, out)
  return out


@pytest.mark.slow
@pytest.mark.skipif(not HAVE, reason='LoCoMo not found under the data root')
def test_research_notebook_executes(tmp_path):
  from nbclient import NotebookClient

  run = _run(tmp_path, tmp_path / 'run', ['pipeline=[cosine,cfsr]', '++pipeline.cfsr.legs.cfsr.pool=40'])
  sweep = tmp_path / 'sweep'
  for i, lam in enumerate(('0.005', '0.05')):  # a two-job "multirun", laid out as Hydra lays one out
    job = _run(
      tmp_path,
      sweep / str(i),
      ['pipeline=[cfsr]', '++pipeline.cfsr.legs.cfsr.pool=40', f'++pipeline.cfsr.legs.cfsr.lam={lam}'],
    )
    (job / '.hydra').mkdir()
    (job / '.hydra' / 'overrides.yaml').write_text(f'- ++pipeline.cfsr.legs.cfsr.lam={lam}\n')
  figs = tmp_path / 'figs'
  nb = nbformat.read(ROOT / 'notebooks' / 'research.ipynb', as_version=4)
  env = {
    'ENGRAM_RUN': str(run),
    'ENGRAM_SWEEP': str(sweep),
    'ENGRAM_FIGS': str(figs),
    'ENGRAM_METRIC': '',
    'ENGRAM_QUESTION': '',
    'JAX_PLATFORMS': 'cpu',
    'MPLBACKEND': 'Agg',
  }
  old = {k: os.environ.get(k) for k in env}
  os.environ.update(env)
  try:
    NotebookClient(
      nb, timeout=120, kernel_name='python3', resources={'metadata': {'path': str(ROOT / 'notebooks')}}
    ).execute()
  finally:
    for k, v in old.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v
  assert {p.name for p in figs.glob('*.png')} == {'categories.png', 'plateau.png', 'coefficients.png'}
  text = '\n'.join(o.get('text', '') for c in nb.cells if c.cell_type == 'code' for o in c.outputs)
  assert 'pool memories get weight' in text and 'Plateau' in text
  assert json.loads((run / 'results.json').read_text())['n_questions'] == 105
