"""Hydra's basic sweeper, composing each job's configuration once instead of twice.

Hydra's ``BasicSweeper`` composes every job of a batch (``validate_batch_is_legal``, to fail before any job runs),
then the launcher composes each job again to run it. Composition costs a few tenths of a second (YAML parsing and
OmegaConf merges of every config file), so in a 100-point sweep whose jobs take 0.1-0.2 s each it is most of the
wall time. :class:`ShapeValidatingSweeper` validates one job per *composition shape* instead: the set of override
keys and the values of those overrides that choose a config group (``dataset=...``, ``pipeline=[...]``,
``hydra/launcher=...``). Jobs that differ only in config values (``eval.k=5``, ``++pipeline.X.k0=20``) compose the
same files in the same order, so one of them stands for all; this project's configs are plain YAML (no structured
configs), where a value cannot fail composition by its type. The launcher still composes and runs every job (it
is untouched: ``hydra/launcher=basic`` or any other), so each job's configuration and results are exactly those of
the stock sweeper (tested in ``tests/experiments/test_sweeper.py``).

Select it with ``hydra/sweeper=shapes`` (``conf/hydra/sweeper/shapes.yaml``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

log = logging.getLogger(__name__)


def composition_shape(overrides: Sequence[str], is_group) -> tuple:
  """What decides which config files one job composes: every override's key (with its prefix, ``+``/``++``/``~``)
  and the value of each override whose key is a config group (``is_group(key) -> bool``)."""
  return shape_of(OverridesParser.create().parse_overrides(list(overrides)), is_group)


def shape_of(parsed, is_group) -> tuple:
  """:func:`composition_shape` of overrides already parsed (``Override`` objects)."""
  shape = []
  for o in parsed:
    key = o.get_key_element()
    shape.append((key, repr(o.value()) if is_group(o.key_or_group) else None))  # lists are not hashable
  return tuple(sorted(shape, key=repr))


def group_test(loader):
  """``is_group(key)`` for ``loader``'s repository: does the override key choose a config group? Without a repository
  every key counts as a group choice (more shapes: validates or composes more, never less)."""
  repo = getattr(loader, 'repository', None)
  return lambda key: repo is None or ('.' not in key and repo.group_exists(key))


class ShapeValidatingSweeper(BasicSweeper):
  """:class:`hydra._internal.core_plugins.basic_sweeper.BasicSweeper` that validates one job per composition shape
  (:func:`composition_shape`) rather than every job; everything else is the basic sweeper's."""

  def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
    loader = self.hydra_context.config_loader
    is_group = group_test(loader)
    tic = time.perf_counter()
    seen: set[tuple] = set()
    for overrides in batch:
      shape = composition_shape(overrides, is_group)
      if shape in seen:
        continue
      seen.add(shape)
      loader.load_sweep_config(master_config=self.config, sweep_overrides=list(overrides))
    log.debug(
      'validated %d of %d jobs (one per composition shape) in %.2f s', len(seen), len(batch), time.perf_counter() - tic
    )
