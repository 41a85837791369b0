"""A run whose legs read no vectors embeds nothing: ``python -m experiments.evaluate 'pipeline=[bm25_lucene]'`` with
the default embedder (MiniLM) and an empty embedding cache encodes no text (no embed phase, no cache report), says
so in its timing and its table's title, and ranks as the same leg does in a run that embeds; a pipeline list with
one leg that reads vectors still embeds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from engram_jax.data import io
from engram_jax.eval import pipeline
from experiments import evaluate
from experiments.lib import common

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / 'conf'
HAVE_LOCOMO = (io.resolve_data_root() / 'locomo' / 'locomo10.json').is_file()
SKIPPED = 'embed skipped (no leg reads vectors)'


def _compose(overrides):
  with initialize_config_dir(config_dir=str(CONF), version_base='1.3'):
    return compose(config_name='config', overrides=list(overrides))


@pytest.mark.parametrize(
  ('overrides', 'reads', 'needs'),
  [
    (['pipeline=[bm25_lucene]'], False, False),
    (['pipeline=[bm25,bm25en,bm25_lucene]'], False, False),
    (['pipeline=[cosine,bm25_lucene]'], True, True),
    (['pipeline=[rrf_cos_bm25]'], True, True),
    (['pipeline=[bm25_lucene]', 'eval.pileup=true'], False, True),  # a pile-up report reads item vectors
    (['pipeline=[bm25_lucene]', 'eval.pileup=false'], False, False),
  ],
  ids=['lucene', 'three bm25', 'cosine+lucene', 'rrf', 'pileup', 'no pileup'],
)
def test_needs_vectors(overrides, reads, needs):
  cfg = _compose(overrides)
  pipes, _ = common.build_pipelines(cfg)
  assert pipeline.reads_vectors(pipes.values()) is reads
  assert evaluate.needs_vectors(cfg, common.eval_settings(cfg), pipes) is needs
  cfg.fitted = '/some/fit'  # a fit's artifact comes with the run: its dimension is checked against the vectors
  assert evaluate.needs_vectors(cfg, common.eval_settings(cfg), pipes) is True


def test_bm25_and_trec_run_read_no_vectors():
  from engram_jax.ops import registry

  lexical = {name for name, op in registry.OPERATORS.items() if not op.vectors}
  assert {'bm25', 'trec_run'} <= lexical
  assert registry.get('cosine').vectors and registry.get('mmr').vectors


def _evaluate(tmp_path: Path, name: str, *overrides: str) -> Path:
  out = tmp_path / name
  cmd = [
    sys.executable,
    '-m',
    'experiments.evaluate',
    *overrides,
    'dataset=locomo',
    'dataset.loader.conversations=[conv-26]',
    'eval.progress=false',
    'eval.n_resamples=200',
    f'paths.cache_dir={tmp_path / "cache"}',  # empty: whatever is embedded is encoded, and reported
    f'hydra.run.dir={out}',
  ]
  done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
  assert done.returncode == 0, done.stderr[-3000:]
  return out


@pytest.mark.slow  # two runs of experiments.evaluate in fresh processes (about 10 s each)
@pytest.mark.skipif(not HAVE_LOCOMO, reason='LoCoMo not found under the data root')
def test_lexical_only_run_embeds_nothing(tmp_path):
  lexical = _evaluate(tmp_path, 'lexical', 'pipeline=[bm25_lucene]')  # the default embedder: MiniLM
  info = json.loads((lexical / 'run_info.json').read_text())
  phases = info['timing']['phases_s']
  assert SKIPPED in phases and 'embed' not in phases
  assert info['embedding_cache'] == []  # no call to the embedder (a cold cache would have encoded every text)
  title = (lexical / 'results.md').read_text().splitlines()[0]
  assert title == '### locomo: 197 questions, k=10, embedder none (no leg reads vectors)'
  assert not any(p.name.startswith('all-MiniLM') for p in (tmp_path / 'cache').iterdir())

  mixed = _evaluate(tmp_path, 'mixed', 'pipeline=[cosine,bm25_lucene]', 'embedder=hashing')
  info = json.loads((mixed / 'run_info.json').read_text())
  phases = info['timing']['phases_s']
  assert 'embed' in phases and SKIPPED not in phases
  assert [r['embedded'] for r in info['embedding_cache']] == [419 + 197]  # conv-26's items and questions
  assert (mixed / 'results.md').read_text().splitlines()[0] == '### locomo: 197 questions, k=10, embedder hashing-256'
  # the constant vectors of the lexical-only run change nothing of the BM25 leg
  a = json.loads((lexical / 'results.json').read_text())
  b = json.loads((mixed / 'results.json').read_text())
  rows = [{k: v for k, v in r['pipelines']['bm25_lucene'].items() if k != 'paired'} for r in (a, b)]
  assert rows[0] == rows[1] and rows[0]['ndcg@10'] > 0.3
  assert [q['retrieved']['bm25_lucene'] for q in a['per_question']] == [
    q['retrieved']['bm25_lucene'] for q in b['per_question']
  ]
