"""docs/vectors.md, executed (slow tier): the page's commands run as written in a scratch folder, the OpenAI script
against a stand-in client (random unit vectors of dimension 1,536, seeded by each text's sha256), the recipe's
evaluate commands on two conversations. The MiniLM commands are dry-run only (tests/test_readme_and_docs.py): their
first run embeds LoCoMo (minutes)."""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engram_jax.data import io, vectors
from tests.test_readme_and_docs import command_lines

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / 'docs' / 'vectors.md'
FENCE = re.compile(r'^```(\w*)\n(.*?)^```', re.S | re.M)
try:
  HAVE = (io.resolve_data_root() / 'locomo' / 'locomo10.json').is_file()
except FileNotFoundError:
  HAVE = False
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not HAVE, reason='LoCoMo not found under the data root')]

STAND_IN = '''
"""A stand-in for the OpenAI client: random unit vectors of dimension 1,536, seeded by each text's sha256."""
import hashlib
from types import SimpleNamespace

import numpy as np


class _Embeddings:
  def create(self, *, model, input):
    data = []
    for i, text in enumerate(input):
      assert text, 'the API refuses empty strings'
      rng = np.random.default_rng(int.from_bytes(hashlib.sha256(text.encode('utf-8')).digest()[:8], 'little'))
      v = rng.normal(size=1536)
      data.append(SimpleNamespace(index=i, embedding=(v / np.linalg.norm(v)).tolist()))
    return SimpleNamespace(data=data[::-1], model=model)  # out of order: the script sorts by index


class OpenAI:
  def __init__(self, **kwargs):
    self.embeddings = _Embeddings()
'''


def _section(title: str) -> list[tuple[str, str]]:
  """(fence language, body) of the blocks under the ``## title`` heading."""
  text = PAGE.read_text()
  start = text.index(f'\n## {title}\n')
  end = text.find('\n## ', start + 1)
  return [(m.group(1), m.group(2)) for m in FENCE.finditer(text[start : end if end > 0 else None])]


def _env(*paths: Path) -> dict[str, str]:
  return {
    **os.environ,
    'PYTHONPATH': os.pathsep.join([*map(str, paths), str(ROOT)]),
    'ENGRAM_DATA_ROOT': str(io.resolve_data_root()),
    'JAX_PLATFORMS': 'cpu',
  }


def _run(argv: list[str], cwd: Path, *extra: str) -> subprocess.CompletedProcess:
  if argv[0] == 'python':
    argv = [sys.executable, *argv[1:], *extra]
    if 'experiments.evaluate' in argv:
      argv.append('eval.progress=false')
  proc = subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, f'{argv}: {proc.stderr[-3000:]}'
  return proc


def test_try_it_here_runs_and_the_results_are_byte_identical(tmp_path):
  (lang, src), *_ = _section('Try it here')
  lines = command_lines(src)
  assert lang == 'bash' and [a[0] for a in lines] == ['python', 'python', 'python', 'cmp']
  for argv in lines:
    _run(argv, tmp_path)  # cmp exits 1 when the files differ
  runs = tmp_path / 'outputs' / 'vectors'
  assert (runs / 'run-vectors' / 'results.md').read_text() == (runs / 'run-hashing' / 'results.md').read_text()
  (report,) = json.loads((runs / 'run-vectors' / 'run_info.json').read_text())['embedding_cache']
  assert report['kind'] == 'vectors' and report['model_id'] == 'hashing-256' and report['normalised'] == 0


def test_the_recipe_runs_with_a_stand_in_client(tmp_path):
  (l1, step1), (l2, script), (l3, step3) = _section('The seed tables with text-embedding-3-small')
  assert (l1, l2, l3) == ('bash', 'python', 'bash')
  (export,) = command_lines(step1)
  _run(export, tmp_path)
  (tmp_path / 'stand_in').mkdir()
  (tmp_path / 'stand_in' / 'openai.py').write_text(STAND_IN)
  (tmp_path / 'embed_elsewhere.py').write_text(textwrap.dedent(script))
  proc = subprocess.run(
    [sys.executable, 'embed_elsewhere.py'],
    cwd=tmp_path,
    env=_env(tmp_path / 'stand_in'),
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  f = vectors.read_vectors(tmp_path / 'outputs' / 'vectors' / 'locomo-te3s.npz')
  assert (f.dim, f.model_id, f.normalised) == (1536, 'text-embedding-3-small', 0)
  assert (len(f.tables['item'].rows), len(f.tables['question'].rows)) == (5882, 1982)
  for i, argv in enumerate(command_lines(step3)):
    out = tmp_path / f'run{i}'
    _run(argv, tmp_path, 'dataset.loader.conversations=[conv-26,conv-30]', f'hydra.run.dir={out}')  # 2: cross-fits
    results = json.loads((out / 'results.json').read_text())
    assert results['n_questions'] > 100
    (report,) = json.loads((out / 'run_info.json').read_text())['embedding_cache']
    assert report['dim'] == 1536 and report['texts_checked'] and report['unused_item_rows'] == 5882 - report['items']
    assert 'embedder text-embedding-3-small' in (out / 'results.md').read_text()
