"""docs/formats.md, executed: its Python blocks that build their own files run in the fast tier (in a scratch folder);
the slow test runs the whole page in order in a scratch folder, the Python blocks exec'd and every command line of its
bash blocks run as written (the export round trip on one conversation, the evaluate runs with the hashing embedder,
ir_measures on the run's files, the external rank_bm25 run evaluated, gridded and fitted). tests/test_readme_and_docs.py dry-runs the commands too."""

from __future__ import annotations

import contextlib
import io as io_
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engram_jax.data import io
from tests.test_readme_and_docs import command_lines

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / 'docs' / 'formats.md'
FENCE = re.compile(r'^```(\w*)\n(.*?)^```', re.S | re.M)
try:
  DATA = io.resolve_data_root()
  HAVE = (DATA / 'locomo' / 'locomo10.json').is_file()
except FileNotFoundError:
  DATA, HAVE = None, False


def _blocks() -> list[tuple[str, str]]:
  return [(m.group(1), m.group(2)) for m in FENCE.finditer(PAGE.read_text())]


def _exec(src: str, name: str) -> str:
  out = io_.StringIO()
  with contextlib.redirect_stdout(out):
    exec(compile(src, name, 'exec'), {'__name__': 'docs_formats'})
  return out.getvalue()


def _printed(after: int, blocks: list[tuple[str, str]]) -> str | None:
  """The ``text`` block right after block ``after`` (what that block prints), if any."""
  nxt = blocks[after + 1] if after + 1 < len(blocks) else None
  return nxt[1] if nxt and nxt[0] == 'text' else None


def test_self_contained_python_blocks_run_and_print_what_the_page_shows(tmp_path, monkeypatch):
  """The blocks that make their own files (the memory log, its refused copy, the BEIR folder) run, print the text
  block that follows them, and their asserts hold; the blocks reading a run folder run in the slow test."""
  monkeypatch.chdir(tmp_path)
  blocks = _blocks()
  ran = 0
  for i, (lang, src) in enumerate(blocks):
    if lang != 'python' or 'outputs/' in src:
      continue
    out = _exec(src, f'docs/formats.md [python {i}]')
    shown = _printed(i, blocks)
    if shown is not None:
      assert out == shown, f'block {i} prints\n{out}\nthe page shows\n{shown}'
    ran += 1
  assert ran == 3


@pytest.mark.slow
@pytest.mark.skipif(not HAVE, reason='LoCoMo not found under the data root')
def test_the_page_runs_in_order(tmp_path, monkeypatch):
  """Every block of the page in order, in a scratch folder: Python exec'd, each bash command run as written (with
  eval.progress=false); the exported conversation's results.json equals the bundled loader's byte for byte."""
  monkeypatch.chdir(tmp_path)
  env = {**os.environ, 'ENGRAM_DATA_ROOT': str(DATA), 'PYTHONPATH': str(ROOT), 'JAX_PLATFORMS': 'cpu'}
  blocks = _blocks()
  commands = 0
  for i, (lang, src) in enumerate(blocks):
    if lang == 'python':
      out = _exec(src, f'docs/formats.md [python {i}]')
      shown = _printed(i, blocks)
      assert shown is None or out == shown, (out, shown)
    elif lang == 'bash':
      for argv in command_lines(src):
        assert argv[0] == 'python', argv
        argv = [sys.executable, *argv[1:]] + (['eval.progress=false'] if 'experiments.evaluate' in argv else [])
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, f'{argv}: {proc.stderr[-3000:]}'
        commands += 1
        if 'ir_measures' in argv[2]:
          assert re.search(r'^nDCG@10\t0\.\d{4}$', proc.stdout, re.M) and re.search(r'^R@10\t', proc.stdout, re.M)
  assert commands == 10  # + the external run: written, evaluated, gridded, fitted
  assert (tmp_path / 'outputs/formats/exported/results.json').read_bytes() == (
    tmp_path / 'outputs/formats/bundled/results.json'
  ).read_bytes()
