"""Fits that several tests read, made once per test session (``shared_run`` in tests/conftest.py): each test asserts
its own part of the same run instead of fitting again."""

from __future__ import annotations

import json
from pathlib import Path

from hydra import compose, initialize_config_dir

CONF = str(Path(__file__).resolve().parents[2] / 'conf')
# two LoCoMo conversations, hashing embedder, rrf_cos_bm25 cross-fitted on 2 folds (3 steps) with the final fit and a
# query adapter that learns through the soft-ranked cosine leg (train_gap: the per-fold training diagnostics)
ADAPTER_FIT = (
  'embedder=hashing',
  'pipeline=[rrf_cos_bm25]',
  'eval.n_resamples=100',
  'eval.progress=false',
  'dataset.loader.conversations=[conv-30,conv-26]',
  'fit.folds=2',
  'fit.steps=3',
  'fit.batch_size=16',
  'fit.baselines=[cosine]',
  'fit.gap_checks=0',
  'fit.final=true',
  'fit.adapter={rank: 2, lr_scale: 0.1, cfsr_grad: implicit, soft_query_legs: true, train_gap: true}',
)


def adapter_fit(shared_run) -> tuple[Path, dict]:
  """The run folder of :data:`ADAPTER_FIT` and its results.json (read by tests/fit/test_artifact.py and
  tests/fit/test_adapter.py)."""

  def make(folder: Path) -> None:
    from experiments import fit as fit_exp

    with initialize_config_dir(config_dir=CONF, version_base='1.3'):
      cfg = compose(config_name='fit', overrides=[*ADAPTER_FIT, f'paths.cache_dir={folder.parent}/adapter_fit_cache'])
    fit_exp.run(cfg, folder)

  folder = shared_run('adapter_fit', make)
  return folder, json.loads((folder / 'results.json').read_text())
