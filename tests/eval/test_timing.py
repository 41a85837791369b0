"""The run timer: phases add up, XLA compilations are counted, a persistent-cache hit is not a compilation."""

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from engram_jax.eval import timing

ROOT = Path(__file__).resolve().parents[2]


def test_phases_and_compilations_are_counted():
  timer = timing.RunTimer()
  with timer.phase('a'):
    jax.jit(lambda x: x * 3 + 1)(jnp.arange(7.0)).block_until_ready()
  with timer.phase('a'):
    pass
  timer.add('b', 0.5)
  out = timer.stop()
  assert out['xla_compilations'] >= 1 and out['compile_requests'] >= out['xla_compilations']
  assert out['phases_s']['b'] == 0.5 and out['phases_s']['a'] > 0 and out['wall_s'] >= out['phases_s']['a']
  jax.jit(lambda x: x * 5 - 2)(jnp.arange(9.0)).block_until_ready()  # after stop: not counted
  assert timer.compiles == out['xla_compilations']
  assert 'XLA compilations' in timing.markdown(out)


_SCRIPT = """
import json, sys
import jax, jax.numpy as jnp
from engram_jax.eval import timing
jax.config.update('jax_compilation_cache_dir', sys.argv[1])
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
t = timing.RunTimer()
jax.jit(lambda x: jnp.sin(x) * 7 + 3)(jnp.arange(11.0)).block_until_ready()
print(json.dumps(t.stop()))
"""


@pytest.mark.slow
def test_a_warm_persistent_cache_compiles_nothing(tmp_path):
  runs = [
    json.loads(
      subprocess.run(
        [sys.executable, '-c', _SCRIPT, str(tmp_path / 'cc')], check=True, capture_output=True, text=True, cwd=ROOT
      )
      .stdout.strip()
      .splitlines()[-1]
    )
    for _ in range(2)
  ]
  assert runs[0]['xla_compilations'] >= 1
  assert runs[1]['xla_compilations'] == 0 and runs[1]['compile_cache_hits'] >= 1
