"""Run a test's script in a fresh Python process, for what one process cannot change after JAX starts (the number
of CPU devices), and read back what it printed after ``RESULT ``."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def script_result(script: str, *, fake_devices: int | None = None, timeout: int = 300) -> Any:
  """``script`` run by this interpreter from the repository root on the CPU platform: with ``fake_devices``, that
  many host devices (``XLA_FLAGS``), else none of the caller's ``XLA_FLAGS``; returns the JSON of its ``RESULT `` line.
  Fails (AssertionError with the end of stderr) if the script exits non-zero."""
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
  env.pop('XLA_FLAGS', None)
  if fake_devices is not None:
    env['XLA_FLAGS'] = f'--xla_force_host_platform_device_count={fake_devices}'
  proc = subprocess.run(
    [sys.executable, '-c', script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  line = next(l for l in proc.stdout.splitlines() if l.startswith('RESULT '))
  return json.loads(line[len('RESULT ') :])
