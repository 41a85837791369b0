"""Hydra's basic launcher, composing each composition shape once instead of every job.

The basic launcher composes every job from the config files (``ConfigLoader.load_sweep_config``: YAML parsing and
OmegaConf merges of every file of the defaults list, ~0.25 s here), then runs it in this process. Jobs of one
*composition shape* (:func:`hydra_plugins.engram_sweeper.shapes_sweeper.composition_shape`: the same override keys
and the same config-group choices) compose the same files in the same order and differ only in the values that
their overrides then write. :class:`ShapeComposingLauncher` composes the first job of each shape as the basic
launcher does and keeps a copy; every later job of the shape is that copy with its own value overrides applied by
Hydra's own ``ConfigLoaderImpl._apply_overrides_to_config`` (the step composition ends with), and with the fields
Hydra derives from the overrides rewritten the way Hydra writes them: ``hydra.overrides.task`` and
``hydra.job.override_dirname``. Everything else in the ``hydra`` node (runtime choices, config sources, cwd,
version) depends only on the shape.

A job takes this path only when each of its value overrides sets a scalar or a list (``key=v``, ``++key=v`` or
``+key=v``): re-applying those to another job's composition writes the same value as applying them to a fresh
one (OmegaConf replaces scalars and lists on merge; a dict value would be merged into the first job's dict). Any
other job (a dict value, a deletion ``~key``, an override of the ``hydra`` node) is composed from the files, as the
basic launcher does. ``tests/experiments/test_sweeper.py`` checks, per job of a sweep over both kinds, that the configuration is
equal to ``load_sweep_config``'s: values, interpolations left unresolved, the ``hydra`` node and the struct and
read-only flags.

Three more savings per job, none changing a file a job writes: the template is kept pickled (a job's copy is
``pickle.loads``, a third of ``copy.deepcopy``'s time), the garbage collector's long-lived objects are frozen while
the jobs run, each job's leftovers as soon as it ends (:func:`settle_heap`), and each job runs through :func:`hydra_plugins.engram_sweeper.lean_job.run_job`
(Hydra's ``run_job`` with fewer copies of the configuration and YAML emitted by libyaml).

Select it with ``hydra/launcher=shapes`` (``conf/hydra/launcher/shapes.yaml``); with ``hydra/sweeper=shapes`` the
validation pass composes once per shape as well.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import pickle
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
from hydra._internal.core_plugins.basic_launcher import BasicLauncher
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.core.utils import JobReturn, configure_log, filter_overrides, setup_globals
from omegaconf import DictConfig, OmegaConf, open_dict

from hydra_plugins.engram_sweeper.lean_job import freeze, run_job
from hydra_plugins.engram_sweeper.shapes_sweeper import group_test, shape_of

log = logging.getLogger(__name__)


def _is_scalar_or_list(value: Any) -> bool:
  if isinstance(value, list):
    return all(_is_scalar_or_list(v) for v in value)
  return value is None or isinstance(value, (str, int, float, bool))


def value_overrides(parsed: Sequence[Override], is_group: Callable[[str], bool]) -> list[Override] | None:
  """The overrides of one job that write config values (not group choices), or None when the job cannot reuse its
  shape's composition (a dict value, a deletion, a ``hydra`` override)."""
  out = []
  for o in parsed:
    if o.is_hydra_override() or o.is_delete():
      return None
    if is_group(o.key_or_group):
      continue
    if o.package is not None or not _is_scalar_or_list(o.value()):
      return None
    out.append(o)
  return out


def reuse(template: bytes, master: DictConfig, parsed: Sequence[Override], values: Sequence[Override]) -> DictConfig:
  """Job config from ``template`` (:func:`freeze` of a composition of the same shape): ``values`` applied, the
  override-derived ``hydra`` fields rewritten from ``parsed`` (the job's sweep overrides, in order: the master's own
  ``hydra`` overrides are in the template already), ``master``'s resolver cache copied."""
  cfg = pickle.loads(template)
  forced = [o if not o.is_add() else _force(o) for o in values]  # the key exists now: '+' re-adds it
  ConfigLoaderImpl._apply_overrides_to_config(forced, cfg)
  app = [o for o in parsed if not o.is_hydra_override()]
  with open_dict(cfg.hydra):
    cfg.hydra.overrides.task = [o.input_line for o in app]
    d = cfg.hydra.job.config.override_dirname
    cfg.hydra.job.override_dirname = get_overrides_dirname(
      overrides=app, kv_sep=d.kv_sep, item_sep=d.item_sep, exclude_keys=d.exclude_keys
    )
  OmegaConf.copy_cache(from_config=master, to_config=cfg)
  return cfg


def settle_heap() -> None:
  """Collect, then freeze every object that survives (``gc.freeze``) until the sweep ends: the imported modules and
  the caches that the first job fills are long-lived, and without this each full collection of the jobs' short-lived
  objects (configuration copies, per-question records) walks them all again: ~1/3 of a fusion sweep job's time on
  LoCoMo (the README's sweep table). The launcher settles before the jobs and after each job: what a job leaves
  behind (its return, with two configuration copies, kept to the end of the sweep) would otherwise pile up unfrozen,
  and the collector's full passes, triggered by the jobs' allocations, walked the returns of every job before
  (~18 ms a job over a 100-job LoCoMo fusion sweep; collecting and freezing one job's leftovers: ~3 ms). The job's
  own configuration must be gone by then (the caller's loop keeps no reference to it): frozen cyclic garbage is never
  collected while frozen. The launcher unfreezes at the end, and leaves the collector alone when it is off or
  something else froze objects."""
  gc.collect()
  gc.freeze()


def _force(o: Override) -> Override:
  """``+key=v`` as ``++key=v`` (same value; no error that the key exists)."""
  return dataclasses.replace(o, type=OverrideType.FORCE_ADD)


class ShapeComposingLauncher(BasicLauncher):
  """:class:`BasicLauncher` that composes once per composition shape (see the module docstring)."""

  def sweep_configs(self, job_overrides: Sequence[Sequence[str]]):
    """Yield each job's composed configuration (before ``hydra.job.id/num``), in order."""
    loader = self.hydra_context.config_loader
    repo = getattr(loader, 'repository', None)
    is_group = group_test(loader)
    parser = OverridesParser.create()
    templates: dict[tuple, bytes] = {}

    def compose(overrides: list[str], shape: tuple | None) -> DictConfig:
      cfg = loader.load_sweep_config(self.config, overrides)
      if shape is not None:
        templates[shape] = freeze(cfg)
      return cfg

    for overrides in job_overrides:
      overrides = list(overrides)
      parsed = parser.parse_overrides(overrides)  # the master's hydra overrides are the same for every job
      values = None if repo is None else value_overrides(parsed, is_group)
      shape = shape_of(parsed, is_group) if values is not None else None
      if shape is not None and shape in templates:
        yield reuse(templates[shape], self.config, parsed, values)
        continue
      yield compose(overrides, shape)  # no local of this frame keeps the job's configuration after the job

  def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
    setup_globals()
    assert self.hydra_context is not None and self.config is not None and self.task_function is not None
    configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
    Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
    log.info(f'Launching {len(job_overrides)} jobs locally (one composition per shape)')
    runs: list[JobReturn] = []
    tic = time.perf_counter()
    own_gc = gc.isenabled() and gc.get_freeze_count() == 0
    try:
      if own_gc:
        settle_heap()
      configs = self.sweep_configs(job_overrides)
      for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
        sweep_config = next(configs)  # not through zip/enumerate: their reused result tuples would keep it alive
        log.info(f'\t#{idx} : {" ".join(filter_overrides(overrides))}')
        with open_dict(sweep_config):
          sweep_config.hydra.job.id = idx
          sweep_config.hydra.job.num = idx
        runs.append(
          run_job(
            hydra_context=self.hydra_context,
            task_function=self.task_function,
            config=sweep_config,
            job_dir_key='hydra.sweep.dir',
            job_subdir_key='hydra.sweep.subdir',
          )
        )
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        del sweep_config  # what is left of the job is what its return keeps, when settle_heap freezes it
        if own_gc:
          settle_heap()
    finally:
      if own_gc:
        gc.unfreeze()
    log.debug('%d jobs in %.1f s', len(job_overrides), time.perf_counter() - tic)
    return runs
