"""Shared by the bench tools: the machine description printed beside every table, the timing and summary
primitives, ``--set`` parsing and the real LoCoMo episodes (embedded through the cache)."""

from __future__ import annotations

import ast
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from engram_jax.testing.synthetic import EmbeddedEpisode


def locomo_episodes(
  root: str | None = None, *, cache_dir: str = '.cache', model_id: str | None = None
) -> list[EmbeddedEpisode]:
  """The real LoCoMo episodes, item / question texts embedded through the cache (MiniLM by default)."""
  from engram_jax.data import embed
  from engram_jax.data.locomo import load_locomo

  episodes, _ = load_locomo(root)
  kw = {} if model_id is None else {'model_id': model_id}
  out = []
  for ep in episodes:
    items = [it.text for it in ep.items]
    vecs = embed.embed_texts(items + [q.text for q in ep.questions], cache_dir=cache_dir, **kw)
    out.append(EmbeddedEpisode(ep, vecs[: len(items)], vecs[len(items) :]))
  return out


def time_jax(fn: Callable[[], jax.Array], repeats: int) -> tuple[float, jax.Array]:
  """Median seconds of ``repeats`` calls (compiled and warmed up beforehand), and the last output."""
  times = []
  out = None
  for _ in range(max(repeats, 1)):
    t = time.perf_counter()
    out = jax.block_until_ready(fn())
    times.append(time.perf_counter() - t)
  return float(np.median(times)), out


def spread(values: Sequence[float] | None) -> dict[str, float] | None:
  """Median, min, max, quartiles of ``values`` (None for None / empty)."""
  if not values:
    return None
  v = np.asarray(values, np.float64)
  q1, med, q3 = np.percentile(v, [25, 50, 75])
  return {'median': float(med), 'min': float(v.min()), 'max': float(v.max()), 'q1': float(q1), 'q3': float(q3)}


def cell(values: Sequence[float] | None, scale: float = 1e3, fmt: str = '{:.1f}', unit: str = '') -> str:
  s = spread(values)
  if s is None:
    return 'n/a'
  f = lambda v: fmt.format(scale * v) + unit
  return f'{f(s["median"])} ({f(s["min"])}-{f(s["max"])})'


def parse_sets(items: Sequence[str]) -> dict[str, dict[str, Any]]:
  """``['tide.pool=10', 'cfsr.batch_size=None']`` -> ``{'tide': {'pool': 10}, 'cfsr': {'batch_size': None}}``."""
  out: dict[str, dict[str, Any]] = {}
  for item in items:
    path, sep, raw = item.partition('=')
    op, dot, knob = path.partition('.')
    if not sep or not dot:
      raise ValueError(f'--set expects OP.KNOB=VALUE, got {item!r}')
    try:
      value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
      value = raw
    out.setdefault(op, {})[knob] = value
  return out


VECTOR_FLAGS = ('avx2', 'avx512f', 'avx512_bf16', 'avx512_vnni', 'avx512_fp16', 'amx_tile', 'amx_bf16', 'amx_int8')


def cpu_model(cpuinfo: str) -> tuple[str, list[str]]:
  """The CPU's model name and which of ``VECTOR_FLAGS`` it has, from the text of ``/proc/cpuinfo`` (its first
  processor).

  >>> cpu_model('model name\t: Xeon\nflags\t\t: fpu avx2 avx512f\n')
  ('Xeon', ['avx2', 'avx512f'])
  """
  fields: dict[str, str] = {}
  for line in cpuinfo.splitlines():
    key, _, value = line.partition(':')
    fields.setdefault(key.strip(), value.strip())
  have = set(fields.get('flags', '').split())
  return fields.get('model name', 'unknown'), [f for f in VECTOR_FLAGS if f in have]


def cpu_settings() -> str:
  """One line: the CPU model and its vector instructions (avx2, avx512f, avx512_bf16, avx512_vnni, avx512_fp16,
  amx), read from ``/proc/cpuinfo`` (elsewhere: ``platform.processor()``, flags unknown)."""
  try:
    with open('/proc/cpuinfo', encoding='utf-8') as f:
      name, flags = cpu_model(f.read())
    have = ' '.join(flags) or 'none of ' + ' '.join(VECTOR_FLAGS)
  except OSError:
    import platform

    name, have = platform.processor() or 'unknown', 'unknown'
  return f'cpu: {name}; {os.cpu_count()} logical CPUs; vector instructions: {have}'


def environment() -> list[str]:
  """The CPU and its vector instructions, the JAX devices and the BLAS / XLA thread settings (what the times
  depend on)."""
  dev = jax.devices()[0]
  return [
    cpu_settings(),
    f'jax {jax.__version__}, numpy {np.__version__}; device {dev} ({dev.platform}, '
    f'{jax.device_count()} device(s)); x64 {bool(jax.config.jax_enable_x64)}',
    device_settings(),
    thread_settings(),
  ]


def device_settings() -> str:
  """One line: every device JAX sees (``jax.devices()``), with its platform and kind; the operator times run on
  the first (the default device), a sharded evaluation (``eval.devices``) on all of them."""
  kinds = ', '.join(f'{d} [{d.platform}, {d.device_kind}]' for d in jax.devices())
  return f'devices: {jax.default_backend()} backend, {jax.device_count()} device(s): {kinds}'


def thread_settings() -> str:
  """One line: the XLA / BLAS thread settings the times depend on (printed beside the table)."""
  try:
    usable = len(os.sched_getaffinity(0))
  except AttributeError:  # not on Linux
    usable = os.cpu_count()
  env = ', '.join(
    f'{k}={os.environ.get(k, "unset")}'
    for k in ('XLA_FLAGS', 'OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'MKL_NUM_THREADS')
  )
  try:
    from threadpoolctl import threadpool_info

    pools = ', '.join(f'{p.get("internal_api")}={p.get("num_threads")}' for p in threadpool_info()) or 'none loaded'
  except ImportError:
    pools = 'unknown (threadpoolctl not installed)'
  return f'threads: {usable}/{os.cpu_count()} CPUs usable; {env}; BLAS pools: {pools}'
