"""A run folder has one writer (issue 50, item 3): :func:`engram_jax.core.runfolder.begin` holds the folder's lock
for the run's life, a second run into it is refused in one line naming the holder, a killed holder's lock is gone,
and the marker vouches only for this run's files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from engram_jax.core import runfolder
from engram_jax.core.errors import EngramError

ROOT = Path(__file__).resolve().parents[2]


def _refused(call, match: str) -> str:
  with pytest.raises(EngramError, match=match) as e:
    call()
  assert '\n' not in str(e.value)
  return str(e.value)


def test_a_second_run_into_a_folder_in_use_is_refused_until_the_first_ends(tmp_path):
  first = runfolder.begin(tmp_path, ['results.json'])
  msg = _refused(
    lambda: runfolder.begin(tmp_path, ['results.json']),
    rf'^run folder {tmp_path} is in use by another run \(pid {os.getpid()} on ',
  )
  assert 'this process' in msg and 'one writer per folder' in msg
  first.write('results.json', '{}')
  first.finish()  # the marker, then the folder released
  assert not (tmp_path / runfolder.LOCK).exists()
  second = runfolder.begin(tmp_path, ['results.json'])
  second.release()
  with runfolder.begin(tmp_path, ['results.json']):  # a run that fails mid-way releases the folder too
    _refused(lambda: runfolder.begin(tmp_path, ['results.json']), 'is in use by another run')
  runfolder.begin(tmp_path, ['results.json']).release()


def test_a_refused_run_changes_nothing_in_the_folder(tmp_path):
  holder = runfolder.begin(tmp_path, ['results.json'])
  holder.write('results.json', '{"run": 1}')
  _refused(lambda: runfolder.begin(tmp_path, ['results.json']), 'is in use by another run')  # removes nothing
  _refused(lambda: runfolder.mark(tmp_path, ['results.json']), 'is in use by another run')  # vouches for nothing
  assert not (tmp_path / runfolder.MARKER).exists()
  holder.finish()
  assert runfolder.check(tmp_path, ['results.json'])['run_id'] == holder.run_id


HOLDER = """
import sys, time
from engram_jax.core import runfolder
run = runfolder.begin(sys.argv[1], ['results.json'])
print('holding', flush=True)
time.sleep(60)
"""


def test_a_run_in_another_process_is_refused_and_a_killed_ones_lock_is_cleared(tmp_path):
  proc = subprocess.Popen([sys.executable, '-c', HOLDER, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
  try:
    assert proc.stdout.readline().strip() == 'holding'
    msg = _refused(
      lambda: runfolder.begin(tmp_path, ['results.json']),
      rf'^run folder {tmp_path} is in use by another run \(pid {proc.pid} on ',
    )
    assert 'this process' not in msg
    proc.send_signal(signal.SIGKILL)  # killed mid-run: its lock file stays, its flock goes with it
    proc.wait(timeout=10)
  finally:
    proc.kill()
    proc.stdout.close()
  assert json.loads((tmp_path / runfolder.LOCK).read_text())['pid'] == proc.pid  # the stale lock
  run = runfolder.begin(tmp_path, ['results.json'])  # not blocked
  assert f'pid {proc.pid} on' in run.lock.stale  # detected ...
  assert json.loads((tmp_path / runfolder.LOCK).read_text())['pid'] == os.getpid()  # ... and cleared
  run.release()


def test_the_marker_refuses_an_output_changed_or_written_by_another_process(tmp_path):
  run = runfolder.begin(tmp_path, ['results.json', 'runs'])
  run.write('results.json', '{"mine": 1}')
  (tmp_path / 'results.json').write_text('{"theirs": 1}')  # another process, after this run wrote it
  _refused(run.finish, rf'^incomplete or mixed run folder {tmp_path}: file results.json changed after this run wrote')
  assert not (tmp_path / runfolder.MARKER).exists() and not (tmp_path / runfolder.LOCK).exists()

  run = runfolder.begin(tmp_path, ['results.json', 'runs'])
  run.write('results.json', '{"mine": 1}')
  (tmp_path / 'runs').mkdir()
  (tmp_path / 'runs' / 'bm25.trec').write_text('q1 Q0 d1 1 1.0 bm25\n')  # not this run's
  _refused(run.finish, 'file runs/bm25.trec was not written by this run')
  assert not (tmp_path / runfolder.MARKER).exists()

  run = runfolder.begin(tmp_path, ['results.json', 'runs'])
  run.write('results.json', '{"mine": 1}')
  runfolder.write_file(tmp_path / 'runs' / 'bm25.trec', 'q1 Q0 d1 1 1.0 bm25\n')  # this run's, by another helper
  assert sorted(run.finish()['files']) == ['results.json', 'runs/bm25.trec']
  (tmp_path / 'results.json').write_text('{"edited": 1}')  # after the run
  _refused(lambda: runfolder.check(tmp_path, ['results.json']), 'file results.json does not match run_complete.json')


def test_hydra_files_are_this_runs(tmp_path):
  hydra = tmp_path / '.hydra'
  hydra.mkdir()
  (hydra / 'overrides.yaml').write_text('- embedder=b\n')  # another run's Hydra, before this run took the folder
  _refused(
    lambda: runfolder.begin(tmp_path, ['results.json'], expect={'.hydra/overrides.yaml': '- embedder=a\n'}),
    rf"^run folder {tmp_path}: file .hydra/overrides.yaml is not this run's",
  )
  (hydra / 'overrides.yaml').write_text('- embedder=a\n')
  run = runfolder.begin(tmp_path, ['results.json'], expect={'.hydra/overrides.yaml': '- embedder=a\n'})
  run.write('results.json', '{}')
  (hydra / 'overrides.yaml').write_text('- embedder=b\n')  # a refused run's Hydra, while this run held the folder
  (hydra / 'config.yaml').write_text('embedder: b\n')  # not there when this run began: not vouched for
  marker = run.finish()
  assert (hydra / 'overrides.yaml').read_text() == '- embedder=a\n'
  assert sorted(marker['files']) == ['.hydra/overrides.yaml', 'results.json']


def test_evaluate_and_fit_refuse_a_folder_in_use(tmp_path):
  """``python -m experiments.evaluate`` / ``experiments.fit`` into a ``hydra.run.dir`` another run writes: one line,
  before any work, the other run's folder untouched."""
  from experiments import evaluate as evaluate_exp
  from experiments import fit as fit_exp

  holder = runfolder.begin(tmp_path, ['results.json'])
  holder.write('results.json', '{"run": 1}')
  _refused(lambda: evaluate_exp.run(OmegaConf.create({}), tmp_path), rf'^run folder {tmp_path} is in use')
  from hydra import compose, initialize_config_dir

  with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[2] / 'conf'), version_base='1.3'):
    cfg = compose(config_name='fit', overrides=['pipeline=[rrf_cos_bm25]'])  # its settings are read (and checked) first
  _refused(lambda: fit_exp.run(cfg, tmp_path), rf'^run folder {tmp_path} is in use')
  holder.finish()
  runfolder.check(tmp_path, ['results.json'])
