"""A fit as a run declares it, typed and checked once: :class:`FitConfig` is built from the plain ``fit`` node of a
configuration (a mapping of plain values, as ``OmegaConf.to_container`` gives it; the library never reads a
configuration tree) by :meth:`FitConfig.from_mapping`, which refuses an unknown key, a value of the wrong type or
range, and a knob listed twice, each in one line naming ``fit.<key>``. What follows (the soft problem, the
components, the loop, the folds) reads the typed fields, never the node again.

Example:
  >>> from engram_jax.fit.config import FitConfig
  >>> fc = FitConfig.from_mapping({'split': 'holdout', 'n_test': 2, 'steps': 5, 'params': ['k0']})
  >>> fc.split, fc.n_test, fc.steps, fc.params_of('rrf_cos_bm25')
  ('holdout', 2, 5, ('k0',))
  >>> FitConfig.from_mapping({'stps': 5})
  Traceback (most recent call last):
  ...
  engram_jax.core.errors.EngramError: unknown option fit.stps (did you mean fit.steps?): no part of the program reads it; known fit keys: [...]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from engram_jax.core import validation
from engram_jax.core.errors import EngramError
from engram_jax.eval.checks import check_flag, check_int, check_known_keys
from engram_jax.fit.problem import Settings, Temperatures

SPLITS = ('crossfit', 'holdout', 'parts')


def _frozen(node: Mapping | None) -> Mapping:
  return MappingProxyType(dict(node or {}))


def _flag(node: Mapping, key: str, default: bool) -> bool:
  return check_flag(node.get(key), 'fit.' + key, default=default)


def _names(value: Any, where: str) -> tuple[str, ...]:
  if value is None:
    return ()
  if isinstance(value, str) or not isinstance(value, Sequence):
    raise EngramError(f'{where} must be a list of names, got {value!r}')
  return tuple(str(v) for v in value)


def _knob_list(value: Any, where: str) -> tuple[str, ...]:
  knobs = _names(value, where)
  twice = sorted({k for k in knobs if knobs.count(k) > 1})
  if twice:
    raise EngramError(f'{where} lists {", ".join(twice)} twice; name each knob once')
  return knobs


def _temperatures(node: Mapping[str, Any]) -> Temperatures:
  allowed = [f.name for f in dataclasses.fields(Temperatures)]
  check_known_keys(list(node), allowed, 'fit.temperatures.')
  return Temperatures(**dict(node))


@dataclasses.dataclass(frozen=True)
class FitConfig:
  """The ``fit`` node of a run (conf/fit/default.yaml documents every key), typed.

  ``optimizer`` and ``train`` stay plain nodes (an optimizer node is built by the caller, e.g. Hydra's
  ``instantiate``; a training dataset node is read by the caller's loader); ``nodes`` holds the set config nodes of
  learned components (``fit.<name>``, by name), ``variants`` the declared fits beside the scalar one (label -> the
  components' names, in order: checked against the components by ``experiments.lib.fit_setup``).

  Example:
    >>> from engram_jax.fit import FitConfig
    >>> fc = FitConfig.from_mapping({'split': 'crossfit', 'folds': 5, 'gap_checks': 2, 'steps': 10})
    >>> fc.folds, fc.monitor_steps(), fc.settings.cfsr_grad
    (5, [0, 5, 10], 'forward')
    >>> FitConfig.from_mapping({'folds': 1})
    Traceback (most recent call last):
    ...
    engram_jax.core.errors.EngramError: fit.folds must be an integer >= 2 for cross-fitting, got 1
  """

  split: str = 'crossfit'
  folds: int = 10
  n_test: int = 3
  seed: int = 0
  steps: int = 60
  batch_size: int = 128
  params: tuple[str, ...] = ()
  params_by_pipeline: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=_frozen)
  train: Mapping | None = None
  optimizer: Mapping = dataclasses.field(default_factory=_frozen)
  temperatures: Temperatures = Temperatures()
  anneal: tuple[float, float] = (1.0, 1.0)
  gap_checks: int = 0
  check_twins: bool = True
  check_twins_questions: int = 512
  settings: Settings = Settings()  # greedy_pool, candidates, solve_batch, cfsr_grad
  nodes: Mapping[str, Mapping] = dataclasses.field(default_factory=_frozen)
  variants: Mapping[str, Any] = dataclasses.field(default_factory=_frozen)
  component_modules: tuple[str, ...] = ()
  reports: Mapping[str, str] = dataclasses.field(default_factory=_frozen)
  check_components: bool = True
  final: bool = False
  baselines: tuple[str, ...] = ()

  # the node's keys that are not fields of the same name (they build `settings`)
  SETTINGS_KEYS = ('greedy_pool', 'candidates', 'solve_batch', 'cfsr_grad')

  @classmethod
  def keys(cls, components: Sequence[str] = ()) -> tuple[str, ...]:
    """Every key a ``fit`` node may hold: the fields (``nodes`` aside), the settings' keys and ``components`` (the
    registered components' names: their nodes ``fit.<name>``)."""
    fields = [f.name for f in dataclasses.fields(cls) if f.name not in ('nodes', 'settings')]
    return (*fields, *cls.SETTINGS_KEYS, *components)

  @classmethod
  def from_mapping(cls, node: Mapping[str, Any], components: Sequence[str] = ()) -> FitConfig:
    """The typed fit of a plain ``fit`` node (missing keys take the defaults above); ``components``: the registered
    components' names (their nodes are ``fit.<name>``). One line (:class:`EngramError`) for the first bad key."""
    node = dict(node)
    check_known_keys(list(node), cls.keys(components), 'fit.')
    split = node.get('split', 'crossfit')
    if split not in SPLITS:
      raise EngramError(f'fit.split must be one of {list(SPLITS)}, got {split!r}')
    folds, n_test = node.get('folds', 10), node.get('n_test', 3)
    if split == 'crossfit':
      folds = check_int(folds, 'fit.folds', minimum=2, why=' for cross-fitting')
    if split == 'parts' and not node.get('train'):
      raise EngramError(
        'fit.split=parts fits on fit.train (a dataset node, e.g. the train part of the scored '
        'benchmark) and scores cfg.dataset; fit.train is not set'
      )
    if split == 'holdout':
      n_test = check_int(n_test, 'fit.n_test', minimum=1, why=' (an empty test split scores nothing)')
    ints = {
      key: check_int(node.get(key, d), f'fit.{key}', minimum=1) for key, d in (('steps', 60), ('batch_size', 128))
    }
    for key, null in (('solve_batch', 'every pool at once'), ('check_twins_questions', '512')):
      if node.get(key) is not None:
        check_int(node[key], f'fit.{key}', minimum=1, why=f' (or null: {null})')
    settings = cls._settings(node)
    temperatures = node.get('temperatures') or {}
    validation.check_positive(dict(temperatures), where='fit.temperatures')
    anneal = list(node.get('anneal') or [1.0, 1.0])
    if len(anneal) != 2:
      raise EngramError(
        f'fit.anneal must be [start, end] (temperature factors of the first and last step), got {anneal}'
      )
    validation.check_positive({'start': anneal[0], 'end': anneal[1]}, where='fit.anneal')
    gap_checks = check_int(node.get('gap_checks') or 0, 'fit.gap_checks', minimum=0, why=' (0 = no soft-vs-hard gap)')
    by_pipe = node.get('params_by_pipeline') or {}
    return cls(
      split=str(split),
      folds=int(folds) if folds is not None else 0,
      n_test=int(n_test) if n_test is not None else 0,
      seed=check_int(node.get('seed', 0), 'fit.seed', minimum=0),
      params=_knob_list(node.get('params'), 'fit.params'),
      params_by_pipeline=_frozen({str(p): _knob_list(v, f'fit.params_by_pipeline.{p}') for p, v in by_pipe.items()}),
      train=_frozen(node['train']) if node.get('train') else None,
      optimizer=_frozen(node.get('optimizer')),
      temperatures=_temperatures(temperatures),
      anneal=(float(anneal[0]), float(anneal[1])),
      gap_checks=gap_checks,
      check_twins=_flag(node, 'check_twins', True),
      check_twins_questions=int(node.get('check_twins_questions') or 512),
      settings=settings,
      nodes=_frozen({c: _frozen(node[c]) for c in components if node.get(c)}),
      variants=_frozen(node.get('variants')),
      component_modules=_names(node.get('component_modules'), 'fit.component_modules'),
      reports=_frozen({str(k): str(v) for k, v in (node.get('reports') or {}).items()}),
      check_components=_flag(node, 'check_components', True),
      final=_flag(node, 'final', False),
      baselines=_names(node.get('baselines'), 'fit.baselines'),
      **ints,
    )

  @staticmethod
  def _settings(node: Mapping[str, Any]) -> Settings:
    d = Settings()
    for key in ('greedy_pool', 'candidates'):
      check_int(node.get(key, getattr(d, key)), f'fit.{key}', minimum=1)
    solve = node.get('solve_batch', d.solve_batch)
    try:
      return Settings(
        greedy_pool=int(node.get('greedy_pool', d.greedy_pool)),
        candidates=int(node.get('candidates', d.candidates)),
        solve_batch=None if solve is None else int(solve),
        cfsr_grad=str(node.get('cfsr_grad', d.cfsr_grad)),
      )
    except ValueError as e:  # a bad value: one line, not a traceback
      raise EngramError(str(e)) from None

  def params_of(self, pipeline: str) -> tuple[str, ...]:
    """The knob paths to fit for config entry ``pipeline``: ``fit.params``, else ``fit.params_by_pipeline[pipeline]``;
    one line when neither names any."""
    params = self.params or self.params_by_pipeline.get(pipeline, ())
    if not params:
      raise EngramError(
        f'nothing to fit: set fit.params or fit.params_by_pipeline.{pipeline}; pipelines with '
        f'entries: {sorted(self.params_by_pipeline)}'
      )
    return tuple(params)

  def monitor_steps(self) -> list[int]:
    """The steps at which the soft-vs-hard gap is measured (``gap_checks`` evenly spaced points and the start;
    [] when off)."""
    n = self.gap_checks
    return sorted({round(i * self.steps / n) for i in range(n + 1)}) if n else []
