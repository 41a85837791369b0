"""A run's evaluation settings, typed and checked once: :class:`EvalConfig` is built from the plain ``eval`` node of
a configuration (a mapping of plain values; the library never reads a configuration tree) by
:meth:`EvalConfig.from_mapping`, which refuses an unknown key and a value of the wrong type or range, each in one
line naming ``eval.<key>``. The entry points read its fields, never the node again.

Example:
  >>> from engram_jax.eval.config import EvalConfig
  >>> ec = EvalConfig.from_mapping({'k': 10, 'metrics': ['ndcg@10'], 'n_resamples': 1000})
  >>> ec.k, ec.metrics, ec.n_resamples, ec.stacked
  (10, ('ndcg@10',), 1000, True)
  >>> EvalConfig.from_mapping({'k': 10, 'nresamples': 100})
  Traceback (most recent call last):
  ...
  engram_jax.core.errors.EngramError: unknown option eval.nresamples (did you mean eval.n_resamples?): no part of the program reads it; known eval keys: [...]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from engram_jax.core.errors import EngramError
from engram_jax.eval.checks import check_flag, check_int, check_known_keys

AUTO = 'auto'


def _flag(node: Mapping, key: str, default: bool) -> bool:
  return check_flag(node.get(key), 'eval.' + key, default=default)


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """The ``eval`` node of a run (conf/eval/default.yaml documents every key), typed.

  ``metrics`` is empty where the node names none (a multi-dataset run reads each dataset's own); ``baselines`` is
  ``'auto'`` or the names given (checked against the run's pipelines by the entry point); ``devices`` and
  ``cpu_devices`` stay as given (``None``/an integer, ``'cores'``/an integer: the entry point resolves them on the
  machine).

  Example:
    >>> from engram_jax.eval.config import EvalConfig
    >>> EvalConfig.from_mapping({'k': 5, 'metrics': ['recall@5'], 'leg_cache_mb': 0}).leg_cache_mb
    0
    >>> EvalConfig.from_mapping({'k': 2.5})
    Traceback (most recent call last):
    ...
    engram_jax.core.errors.EngramError: eval.k must be an integer >= 1, got 2.5
  """

  k: int = 10
  metrics: tuple[str, ...] = ()
  n_resamples: int = 10000
  baselines: str | tuple[str, ...] = AUTO
  progress: bool = True
  pileup: bool = False
  stacked: bool = True
  max_waste: float = 2.0
  devices: int | None = None
  cpu_devices: Any = 'cores'
  leg_cache_mb: int = 2048
  grid_chunk: int = 64
  grid_ranked: int | None = None
  grid_max_points: int = 100000

  @classmethod
  def keys(cls) -> tuple[str, ...]:
    """Every key an ``eval`` node may hold."""
    return tuple(f.name for f in dataclasses.fields(cls))

  @classmethod
  def from_mapping(cls, node: Mapping[str, Any]) -> EvalConfig:
    """The typed settings of a plain ``eval`` node (missing keys take the defaults above); one line
    (:class:`EngramError`) for the first unknown key or bad value."""
    from engram_jax.metrics import stats

    node = dict(node)
    check_known_keys(list(node), cls.keys(), 'eval.')
    d = cls()
    k = check_int(node.get('k', d.k), 'eval.k', minimum=1)
    n_resamples = node.get('n_resamples', d.n_resamples)
    stats.check_resamples(n_resamples, where='eval.n_resamples')
    metrics = node.get('metrics') or ()
    if isinstance(metrics, str):
      raise EngramError(f'eval.metrics must be a list of metric names, got the string {metrics!r}; write [{metrics}]')
    baselines = node.get('baselines', AUTO)
    if baselines is not None and baselines != AUTO:
      if isinstance(baselines, str) or not isinstance(baselines, Sequence):
        raise EngramError(f'eval.baselines must be auto or a list of pipelines, got {baselines!r}')
      baselines = tuple(str(b) for b in baselines)
    devices = node.get('devices')
    if devices is not None and (isinstance(devices, bool) or not isinstance(devices, int) or devices < 1):
      raise EngramError(f'eval.devices must be null (all devices) or an integer >= 1, got {devices!r}')
    cpu = node.get('cpu_devices', d.cpu_devices)
    if cpu != 'cores' and (isinstance(cpu, bool) or not isinstance(cpu, int) or cpu < 1):
      raise EngramError(f"eval.cpu_devices must be 'cores' or an integer >= 1, got {cpu!r}")
    mb = node.get('leg_cache_mb', d.leg_cache_mb)
    if isinstance(mb, bool) or not isinstance(mb, int) or mb < 0:
      raise EngramError(f'eval.leg_cache_mb must be an integer >= 0 (0: no cache), got {mb!r}')
    return cls(
      k=k,
      metrics=tuple(str(m) for m in metrics),
      n_resamples=int(n_resamples),
      baselines=AUTO if baselines is None else baselines,
      progress=_flag(node, 'progress', d.progress),
      pileup=_flag(node, 'pileup', d.pileup),
      stacked=_flag(node, 'stacked', d.stacked),
      max_waste=float(node.get('max_waste', d.max_waste)),
      devices=devices,
      cpu_devices=cpu,
      leg_cache_mb=mb,
      grid_chunk=int(node.get('grid_chunk', d.grid_chunk)),
      grid_ranked=node.get('grid_ranked'),
      grid_max_points=check_int(node.get('grid_max_points', d.grid_max_points), 'eval.grid_max_points', minimum=1),
    )
