"""Shared test settings: a deterministic hypothesis profile (as JAX's own test_util), float64 for refs, and run
folders shared across the session (:func:`shared_run`)."""

import os
import shutil
from pathlib import Path

import filelock
import hypothesis
import jax
import pytest

hypothesis.settings.register_profile(
  'deterministic',
  database=None,
  derandomize=True,
  deadline=None,
  max_examples=40,
  suppress_health_check=[hypothesis.HealthCheck.too_slow],
)
# The fast tier (-m 'not slow', the edit-test loop) tries each property on 10 examples instead of 40.
hypothesis.settings.register_profile('fast', hypothesis.settings.get_profile('deterministic'), max_examples=10)
hypothesis.settings.load_profile(os.environ.get('HYPOTHESIS_PROFILE', 'deterministic'))


def pytest_configure(config):
  """``-m 'not slow'`` loads the ``fast`` hypothesis profile, unless ``HYPOTHESIS_PROFILE`` names one."""
  if ' '.join(config.getoption('markexpr', '').split()) == 'not slow' and 'HYPOTHESIS_PROFILE' not in os.environ:
    hypothesis.settings.load_profile('fast')


jax.config.update('jax_enable_x64', True)
# One CPU device per test process, whatever runs first: the entry points' eval.cpu_devices takes effect only before
# JAX's first computation, which this is (tests that need several devices fake them in a subprocess).
jax.devices()


@pytest.fixture(scope='session')
def shared_run(tmp_path_factory, worker_id):
  """``shared_run(name, make) -> folder``: the run folder ``make(folder)`` writes, made once per test session and
  shared by every test (and every xdist worker) that asks for ``name`` (a file lock in the session's base folder):
  an expensive fit several tests read instead of each recomputing it. Readers must not write into it."""
  root = tmp_path_factory.getbasetemp()
  root = (root if worker_id == 'master' else root.parent) / 'shared_runs'
  root.mkdir(parents=True, exist_ok=True)

  def get(name: str, make) -> Path:
    folder, done = root / name, root / f'{name}.done'
    with filelock.FileLock(str(root / f'{name}.lock')):
      if not done.is_file():
        if folder.exists():
          shutil.rmtree(folder)  # a maker that failed in another test: start over
        make(folder)
        done.write_text('')
    return folder

  return get
