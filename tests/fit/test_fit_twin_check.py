"""experiments.fit refuses to fit a leg whose soft twin, cold, is not its hard leg (issue 17), and fits one that is.

The BM25 x (1 + c t^p) operator of docs/extending.md twice: with the twin bug of ``tests/ops/buggy_recency.py``
(``write_time`` summed over the ``[B, N]`` batch) and as the guide writes it. On random padded episodes (fast) and
through ``experiments.fit`` on two LoCoMo conversations (slow).
"""

from __future__ import annotations

import contextlib
import importlib
import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from engram_jax import fit
from engram_jax.data import io
from engram_jax.eval import pipeline as P
from engram_jax.ops import registry
from engram_jax.testing.episodes import random_padded_episodes
from experiments import fit as fit_exp
from tests.experiments import test_docs

CONF = str(Path(__file__).resolve().parents[2] / 'conf')
try:
  HAVE = (io.resolve_data_root() / 'locomo' / 'locomo10.json').is_file()
except FileNotFoundError:
  HAVE = False
NODE = {'fusion': 'none', 'legs': {'rec': {'op': 'bm25_recent'}}}
PARAMS = ['legs.rec.c', 'legs.rec.p', 'legs.rec.k1', 'legs.rec.b']


@contextlib.contextmanager
def operator(version: str):
  """``bm25_recent`` registered as the buggy fixture or as docs/extending.md writes it (module ``mypkg.bm25_recent``);
  the registry and ``sys.modules`` restored afterwards."""
  before = dict(registry.OPERATORS)
  run = test_docs.DocRun(Path(CONF), Path('.'))
  try:
    if version == 'buggy':
      importlib.reload(importlib.import_module('tests.ops.buggy_recency'))
      yield 'tests.ops.buggy_recency'
    else:
      (src,) = [s for lang, s in test_docs.blocks() if lang == 'python' and s.startswith('# mypkg/bm25_recent.py')]
      run.python(src)
      yield 'mypkg.bm25_recent'
  finally:
    registry.OPERATORS.clear()
    registry.OPERATORS.update(before)
    for name in run.modules:
      importlib.sys.modules.pop(name, None)


def _check(seed=0):
  episodes, arrays = random_padded_episodes(seed)
  pipe = P.make_pipeline(legs=NODE['legs'], name='bm25_recent')
  problem, _, every = fit.make_problem(pipe, PARAMS)
  rows = fit.build_rows(problem, pipe, episodes, arrays, seed=seed)
  fit_exp.check_twins(problem, rows, episodes, arrays, every, seed=seed, max_questions=512)


def test_check_before_step_0_refuses_the_buggy_twin_by_name():
  with operator('buggy'):
    with pytest.raises(
      ValueError,
      match=r'^refusing to fit: operator bm25_recent \(leg rec, hand-set knob values\): '
      r'cold soft twin != hard leg: top-10 ids differ on [1-9]',
    ):
      _check()


def test_check_before_step_0_passes_the_guide_s_operator():
  with operator('docs'):
    _check()


def _compose(module: str, tmp_path, extra=()):
  with initialize_config_dir(config_dir=CONF, version_base='1.3'):
    return compose(
      config_name='fit',
      overrides=[
        'embedder=hashing',
        'dataset.loader.conversations=[conv-30,conv-26]',
        'pipeline=[]',
        f'ops_modules=[{module}]',
        '+pipeline.bm25_recent={fusion: none, legs: {rec: {op: bm25_recent}}}',
        f'fit.params=[{",".join(PARAMS)}]',
        'fit.folds=2',
        'fit.steps=3',
        'fit.batch_size=32',
        'fit.gap_checks=0',
        'fit.baselines=[bm25]',
        'eval.n_resamples=100',
        'eval.progress=false',
        f'paths.cache_dir={tmp_path}/cache',
        *extra,
      ],
    )


@pytest.mark.slow
@pytest.mark.skipif(not HAVE, reason='LoCoMo not found under the data root')
def test_experiments_fit_refuses_the_buggy_twin_and_fits_the_right_one(tmp_path):
  with operator('buggy') as module:
    cfg = _compose(module, tmp_path)
    with pytest.raises(ValueError, match=r'refusing to fit: operator bm25_recent'):
      fit_exp.run(cfg, tmp_path / 'buggy')
    assert not (tmp_path / 'buggy' / 'fitted.json').exists()
    fit_exp.run(_compose(module, tmp_path, ['fit.check_twins=false']), tmp_path / 'unchecked')  # the skip switch
  with operator('docs') as module:
    res = fit_exp.run(_compose(module, tmp_path), tmp_path / 'right')
  fitted = json.loads((tmp_path / 'right' / 'fitted.json').read_text())
  assert sorted(fitted['folds']) == ['conv-26', 'conv-30'] and res['params'] == PARAMS
