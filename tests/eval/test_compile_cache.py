"""The shared JAX compilation cache: jobs stage privately and publish whole entries atomically; a warm second
process compiles nothing; two processes racing on one folder leave only whole entries."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engram_jax.eval import compile_cache

ROOT = Path(__file__).resolve().parents[2]
JOB = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp
    from jax import monitoring
    hits = []
    monitoring.register_event_listener(lambda name, **kw: hits.append(name) if name.endswith('cache_hits') else None)
    from omegaconf import OmegaConf
    from experiments.lib import common
    common.enable_compile_cache(OmegaConf.create({'paths': {'compile_cache_dir': sys.argv[1]}}))
    f = jax.jit(lambda x: jnp.sin(x) * float(sys.argv[2]))
    print(float(f(jnp.float32(1.0))), len(hits))
""")


def _run(folder, scale):
  return subprocess.Popen(
    [sys.executable, '-c', JOB, str(folder), str(scale)],
    cwd=ROOT,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )


def test_stage_links_and_publish_is_atomic_and_idempotent(tmp_path):
  shared = tmp_path / 'jc'
  shared.mkdir()
  (shared / 'a-cache').write_bytes(b'A' * 10)
  private = compile_cache.stage(shared)
  assert private.parent == shared and (private / 'a-cache').read_bytes() == b'A' * 10
  assert os.stat(private / 'a-cache').st_ino == os.stat(shared / 'a-cache').st_ino  # a hard link, not a copy
  (private / 'b-cache').write_bytes(b'B' * 5)
  other = compile_cache.stage(shared)
  (other / 'b-cache').write_bytes(b'B' * 5)
  assert compile_cache.publish(private, shared) == ['b-cache']
  assert compile_cache.publish(other, shared) == []  # already there: one whole entry
  assert sorted(p.name for p in shared.iterdir()) == ['a-cache', 'b-cache']  # staging folders gone, no temp files
  assert (shared / 'b-cache').read_bytes() == b'B' * 5


@pytest.mark.slow
def test_concurrent_jobs_share_one_folder(tmp_path):
  shared = tmp_path / 'jc'
  jobs = [_run(shared, s) for s in (2.0, 2.0, 3.0)]  # two compile the same program at once, one another
  outs = [j.communicate(timeout=300) for j in jobs]
  assert all(j.returncode == 0 for j in jobs), [e for _, e in outs]
  values = [float(o.split()[0]) for o, _ in outs]
  assert values[:2] == [values[0]] * 2
  entries = sorted(shared.glob('*-cache'))
  assert entries and not list(shared.glob('.stage-*')) and not list(shared.glob('.*.tmp'))
  # a warm process reads every published entry whole: no 'Error reading persistent compilation cache entry'
  warm = _run(shared, 2.0)
  out, err = warm.communicate(timeout=300)
  value, hits = out.split()
  assert warm.returncode == 0 and float(value) == values[0]
  assert 'Error reading' not in err, err
  assert int(hits) >= 1  # served from the shared cache (keys do not depend on the staging folder's path)


KILLED = textwrap.dedent("""
    import os, sys, jax, jax.numpy as jnp
    from omegaconf import OmegaConf
    from experiments.lib import common
    cfg = OmegaConf.create({'paths': {'compile_cache_dir': sys.argv[1]}})
    common.enable_compile_cache(cfg)
    f = jax.jit(lambda x: jnp.cos(x) * float(sys.argv[2]))
    from jax import monitoring
    hits = []
    monitoring.register_event_listener(lambda name, **kw: hits.append(name) if name.endswith('cache_hits') else None)
    out = float(f(jnp.float32(1.0)))
    print(out, len(common.publish_compile_cache(cfg)), len(hits), flush=True)
    os._exit(0)  # a Ray worker: killed after its job, no exit handlers
""")


@pytest.mark.slow
def test_entries_published_after_a_job_survive_a_worker_killed_without_exit_handlers(tmp_path):
  shared = tmp_path / 'jc'
  job = subprocess.run(
    [sys.executable, '-c', KILLED, str(shared), '5.0'],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert job.returncode == 0, job.stderr
  value, published, _ = job.stdout.split()
  assert int(published) >= 1 and len(list(shared.glob('*-cache'))) == int(published)
  assert len(list(shared.glob('.stage-*'))) == 1  # the dead worker's staging folder: no exit handler removed it
  again = subprocess.run(
    [sys.executable, '-c', KILLED, str(shared), '5.0'],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert again.returncode == 0, again.stderr
  value2, published2, hits = again.stdout.split()
  assert float(value2) == float(value) and int(hits) >= 1 and int(published2) == 0  # served by the shared entries
  assert len(list(shared.glob('.stage-*'))) == 1  # the first worker's folder removed (its pid is gone)
