"""Where a run's time goes: named phases and the XLA compilations made while they ran.

:class:`RunTimer` times phases (``with timer.phase('embed'): ...``) and counts XLA backend compilations and their
duration through ``jax.monitoring`` (the events JAX emits for every compilation; a compilation served by the
persistent compilation cache is counted as a cache hit, not a compilation, so a warm rerun counts 0).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from jax import monitoring

COMPILE_EVENT = '/jax/core/compile/backend_compile_duration'  # fires for every compile request, cached or not
CACHE_HIT_EVENT = '/jax/compilation_cache/cache_hits'  # a request served by the persistent cache


class RunTimer:
  """Wall time per phase (seconds, summed over repeated phases) and the XLA compilations seen since creation."""

  def __init__(self) -> None:
    self.phases: dict[str, float] = {}
    self.requests = 0
    self.cache_hits = 0
    self.compile_s = 0.0
    self._start = time.perf_counter()
    self._active = True
    monitoring.register_event_duration_secs_listener(self._on_duration)
    monitoring.register_event_listener(self._on_event)

  def _on_duration(self, event: str, duration: float, **_: Any) -> None:
    if self._active and event == COMPILE_EVENT:
      self.requests += 1
      self.compile_s += float(duration)

  def _on_event(self, event: str, **_: Any) -> None:
    if self._active and event == CACHE_HIT_EVENT:
      self.cache_hits += 1

  @property
  def compiles(self) -> int:
    """XLA compilations actually made (compile requests not served by the persistent cache)."""
    return self.requests - self.cache_hits

  @contextlib.contextmanager
  def phase(self, name: str) -> Iterator[None]:
    t0 = time.perf_counter()
    try:
      yield
    finally:
      self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - t0

  def add(self, name: str, seconds: float) -> None:
    self.phases[name] = self.phases.get(name, 0.0) + float(seconds)

  def stop(self) -> dict[str, Any]:
    """Stop counting; returns ``{'wall_s', 'phases_s': {...}, 'xla_compilations', 'compile_requests',
    'compile_cache_hits', 'compile_s'}`` (``compile_s``: time in compile requests, cache loads included)."""
    self._active = False
    return {
      'wall_s': time.perf_counter() - self._start,
      'phases_s': dict(self.phases),
      'xla_compilations': self.compiles,
      'compile_requests': self.requests,
      'compile_cache_hits': self.cache_hits,
      'compile_s': self.compile_s,
    }


def markdown(summary: dict[str, Any]) -> str:
  """One line per phase with its share of the wall time, then the compilations."""
  wall = summary['wall_s']
  lines = [f'Timing: wall {wall:.1f}s']
  phases = dict(summary['phases_s'])
  phases['other (config, pipelines, embedder set-up)'] = max(wall - sum(phases.values()), 0.0)
  for name, s in phases.items():
    lines.append(f'- {name}: {s:.2f}s ({100 * s / wall:.0f}%)' if wall > 0 else f'- {name}: {s:.2f}s')
  lines.append(
    f'- XLA compilations: {summary["xla_compilations"]} of {summary["compile_requests"]} compile requests '
    f'({summary["compile_cache_hits"]} served by the persistent cache; {summary["compile_s"]:.2f}s in all)'
  )
  retrieve = summary['phases_s'].get('retrieve', 0.0)
  if retrieve > 0:
    lines.append(f'- overhead ratio (wall / retrieve): {wall / retrieve:.2f}')
  if summary.get('n_questions'):
    n = summary['n_questions']
    lines.append(f'- per question ({n} scored): {1e3 * wall / n:.2f} ms wall, {1e3 * retrieve / n:.3f} ms retrieve')
  return '\n'.join(lines)
