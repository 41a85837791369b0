"""Config validation for the entry points, run before any data is loaded or embedded.

Each check raises ``ValueError`` with one line that names the option and the allowed values. Operator knob ranges
are checked by the library when a pipeline is built (:mod:`engram_jax.core.validation`); this module checks what only
the config knows: metrics per dataset, baselines, training sets, splits and fitting settings.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig

from engram_jax.core import runfolder
from engram_jax.core.errors import EngramError
from engram_jax.eval.checks import (  # the checks on plain values and episodes live in the library
  check_known_keys,
  check_metrics,
)
from engram_jax.eval.config import EvalConfig
from experiments.lib import common
from experiments.lib.common import CONF, dataset_metrics

log = logging.getLogger(__name__)

AUTO = 'auto'
# The top-level keys an entry point reads (evaluate and fit): any other key of the composed configuration (a
# `+key=...` nobody reads, a typo) is refused by :func:`check_keys`. A new top-level option is one line here.
TOP_LEVEL_KEYS = (
  'hydra',
  'dataset',
  'datasets',
  'embedder',
  'pipeline',
  'eval',
  'reader',
  'train_sets',
  'local',
  'experiment',
  'paths',
  'fit',
  'seed',
  'ops_modules',
  'reference',
  'reference_label',
  'fitted',
  'values',
  'primary_metric',
  'protocol_name',
  'protocol_force',
  'protocol_ledger',
  'grid',  # +grid='{knob path: [values]}' (experiments/lib/grid.py)
  'fitted_variant',  # +fitted_variant=adapter: which variant of a fit's artifact fitted=RUN applies
  'fitted_force',  # fitted_force=true: apply an artifact whose pipeline or embedder differs from the run's (recorded)
  'ext_run',  # ext_run=FILE: the TREC run of the trec_run legs of conf/pipeline/*ext.yaml (docs/formats.md)
  'ext_run_max_unmatched',  # the share of unmatched questions / doc ids over which an external run stops the run
)
EVAL_KEYS = (
  'k',
  'metrics',
  'n_resamples',
  'baselines',
  'progress',
  'stacked',
  'max_waste',
  'devices',
  'cpu_devices',
  'leg_cache_mb',
  'pileup',
  'grid_chunk',
  'grid_ranked',
  'grid_max_points',
)
DEFAULT_BASELINES = ('cosine', 'rrf_cos_bm25')
PARTS = ('all', 'pilot', 'train', 'confirm')


def datasets_of(cfg: DictConfig) -> dict[str, DictConfig]:
  """The scored datasets of a run: ``cfg.datasets`` when set, else ``{cfg.dataset.name: cfg.dataset}``."""
  return dict(cfg.datasets) if cfg.get('datasets') else {cfg.dataset.name: cfg.dataset}


def _settings(cfg: DictConfig, settings: EvalConfig | None) -> EvalConfig:
  return common.eval_settings(cfg) if settings is None else settings


def metrics_for(cfg: DictConfig, ds: DictConfig, settings: EvalConfig | None = None) -> list[str]:
  """The metrics scored on dataset ``ds``: ``eval.metrics`` in a one-dataset run (it defaults to the dataset's
  own list), the dataset's list in a multi-dataset run (``settings``: the run's typed ``eval`` node, default read from
  ``cfg``)."""
  if cfg.get('datasets'):
    return list(ds.metrics)
  return list(_settings(cfg, settings).metrics)


def resolve_baselines(cfg: DictConfig, settings: EvalConfig | None = None) -> list[str]:
  """``eval.baselines``: ``auto`` (the default) = those of cosine and rrf_cos_bm25 that are in the run; an explicit
  list must name pipelines of the run."""
  chosen = _settings(cfg, settings).baselines
  names = list(cfg.pipeline)
  if chosen is None or chosen == AUTO:
    return [b for b in DEFAULT_BASELINES if b in names]
  chosen = list(chosen)
  unknown = [b for b in chosen if b not in names]
  if unknown:
    raise EngramError(f'eval.baselines names {unknown}, which are not in this run; allowed: {names} (or auto)')
  return chosen


def _check_loader(loader: Any, where: str) -> None:
  part = loader.get('part') if loader is not None else None
  if part is None:
    return
  if part not in PARTS:
    raise EngramError(f'{where}.loader.part must be one of {list(PARTS)}, got {part!r}')
  n_train = loader.get('n_train')
  if part == 'train' and n_train is not None and int(n_train) < 1:
    raise EngramError(f'{where}.loader.n_train must be >= 1 (an empty training split), got {n_train}')


def check_run_settings(cfg: DictConfig) -> None:
  """The settings every entry point shares: ``seed`` (a NumPy seed: an integer >= 0); ``eval.n_resamples`` (an
  integer >= :data:`engram_jax.metrics.stats.MIN_RESAMPLES`) is checked with the rest of the ``eval`` node
  (:meth:`engram_jax.eval.config.EvalConfig.from_mapping`)."""
  seed = cfg.get('seed')
  if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
    raise EngramError(f'seed must be an integer >= 0, got {seed!r}')


def check_dataset_k(ds: DictConfig, k: int, where: str) -> None:
  """A dataset's own lower bound on ``eval.k`` (``min_k``: e.g. LongMemEval's turn->session metrics need the top
  turns to cover k sessions), checked before any work."""
  min_k = ds.get('min_k')
  if min_k is not None and k < int(min_k):
    raise EngramError(
      f'{where}: its metrics need eval.k >= {min_k} (the ranking must reach that deep), got '
      f'eval.k={k}; set eval.k={min_k}'
    )


def check_loader_selection(loader: Any, where: str) -> None:
  """An explicit selection of episodes (``loader.conversations``) must name at least one."""
  if loader is None:
    return
  conv = loader.get('conversations')
  if isinstance(conv, str):
    raise EngramError(
      f'{where}.loader.conversations must be a list of ids, got the string {conv!r} (read as its characters); '
      f'write {where}.loader.conversations=[{conv}]'
    )
  if conv is not None and len(conv) == 0:
    raise EngramError(
      f'{where}.loader.conversations is empty (nothing to score); give at least one id, or null for all'
    )


def _unknown(keys, allowed, where: str) -> None:
  check_known_keys(list(keys), list(allowed), where)


def check_keys(cfg: DictConfig) -> None:
  """Refuse a key of the composed configuration that the program does not read: a top-level key outside
  :data:`TOP_LEVEL_KEYS` (e.g. ``+grd=...``, a typo of ``+grid``), before any work; an ``eval`` key outside
  :meth:`engram_jax.eval.config.EvalConfig.keys` (e.g. the typo ``+eval.nresamples=100``) is refused where the
  node is read (:func:`experiments.lib.common.eval_settings`)."""
  _unknown(list(cfg.keys()), TOP_LEVEL_KEYS, '')
  check_listed_once(cfg)


def check_reader(cfg: DictConfig) -> None:
  """A reader (Tier 1) needs every scored dataset to declare an answer task, and ``reader.questions`` is null or
  an integer >= 1; checked before loading."""
  if not (cfg.get('reader') and cfg.reader.get('name', 'none') != 'none'):
    return
  for name, ds in datasets_of(cfg).items():
    if ds.get('answer') is None:
      import yaml

      with_task = sorted(
        p.stem for p in (CONF / 'dataset').glob('*.yaml') if 'answer' in (yaml.safe_load(p.read_text()) or {})
      )
      raise EngramError(
        f'reader={cfg.reader.name}: dataset {name} declares no answer task (dataset.answer.task), so nothing can be '
        f'answered on it; choose a dataset with one ({", ".join(with_task)}) or reader=none'
      )
  n = cfg.reader.get('questions')
  if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
    raise EngramError(f'reader.questions must be an integer >= 1 (or null: all), got {n!r}')


def check_external_runs(cfg: DictConfig, pipes: Mapping[str, Any], episodes, k: int) -> None:
  """Every ``trec_run`` leg's file against the loaded episodes, before any embedding or scoring
  (:func:`engram_jax.ops.trec_run.check_match`: nothing matched, or more missing questions or unknown doc ids than
  ``ext_run_max_unmatched``, refused; used alone, fewer than ``k`` items for a question refused)."""
  from engram_jax.ops import trec_run

  limit = float(cfg.get('ext_run_max_unmatched', 0.5))
  if not 0 <= limit <= 1:
    raise EngramError(f'ext_run_max_unmatched must be in [0, 1], got {limit}')
  seen: dict[str, int | None] = {}
  for pipe in pipes.values():
    alone = len(pipe.legs) == 1 and pipe.fusion == 'none'
    for leg in pipe.legs:
      if leg.op == 'trec_run':
        path = str(leg.option('path'))
        want = k if alone else None
        seen[path] = max(want or 0, seen.get(path) or 0) or None
  for path, alone_k in seen.items():
    trec_run.check_match(path, trec_run.match(path, episodes), max_unmatched=limit, alone_k=alone_k)


def check_loaded(cfg: DictConfig, name: str, episodes, settings: EvalConfig | None = None) -> None:
  """What needs the loaded data but no embedding: ``eval.k`` within every episode, ``reader.questions`` within
  the scored questions, and a ``fitted=`` file covering every scored episode (dataset ``name``)."""
  where = f'dataset {name}'
  k = _settings(cfg, settings).k
  small = [e for e in episodes if e.n_items < k]  # as evaluation.evaluate requires, after embedding
  if small:
    e = min(small, key=lambda e: e.n_items)
    raise EngramError(
      f'{where}: eval.k={k} is larger than episode {e.id} ({e.n_items} items; {len(small)} episode(s) have fewer '
      f'than {k}); set eval.k <= {e.n_items}'
    )
  n_q = sum(len(e.questions) for e in episodes)
  asked = [e for e in episodes if e.questions]
  for pname in cfg.pipeline:  # a tune without training sets is cross-fitted by episode: one needs two
    node = cfg.pipeline[pname]
    if node.get('tune') and not node.tune.get('train') and name not in (node.get('skip_datasets') or []):
      if len(asked) < 2:
        raise EngramError(
          f'{where}: pipeline {pname} chooses {node.tune.param} by leave-one-episode-out cross-fitting, which needs '
          f'at least two episodes with questions, got {len(asked)}; name more episodes or leave {pname} out'
        )
  if cfg.get('reader') and cfg.reader.get('name', 'none') != 'none':
    n = cfg.reader.get('questions')
    if n is not None and n > n_q:
      raise EngramError(f'reader.questions must be in 1..{n_q} (the questions of {where}), got {n}')
  if cfg.get('fitted') and not Path(str(cfg.fitted)).is_dir():  # an artifact folder applies its final fit elsewhere
    try:
      fitted = json.loads(Path(cfg.fitted).read_text())
    except (OSError, json.JSONDecodeError) as e:
      raise EngramError(f'fitted={cfg.fitted}: not a readable fitted.json ({e})') from None
    pipe = fitted.get('pipeline')
    skipped = pipe in cfg.pipeline and name in (cfg.pipeline[pipe].get('skip_datasets') or [])
    missing = sorted(e.id for e in episodes if e.questions and e.id not in fitted.get('folds', {}))
    if missing and not skipped:
      shown = ', '.join(missing[:10]) + (f', ... ({len(missing)} in all)' if len(missing) > 10 else '')
      raise EngramError(
        f'fitted={cfg.fitted}: no fitted parameters for episodes {shown} of {where} (the fit scored other '
        'episodes); evaluate it on the dataset it was fitted on'
      )


def check_fitted_file(cfg: DictConfig) -> None:
  """``fitted=PATH`` names a readable fitted.json of ``experiments.fit`` (``{"pipeline", "folds"}``), or a fit's run
  folder or artifact folder holding an artifact ``manifest.json`` (:func:`engram_jax.fit.artifact.resolve`)."""
  if not cfg.get('fitted'):
    return
  if Path(str(cfg.fitted)).is_dir():
    from engram_jax.fit import artifact  # here: flax and safetensors only when an artifact is asked for

    run = runfolder.run_folder_of(str(cfg.fitted))
    if run is not None:  # a fit's run folder: whole, before any of its files is read
      runfolder.check(run)
    try:
      artifact.resolve(str(cfg.fitted), cfg.get('fitted_variant'))
    except (OSError, ValueError) as e:
      raise EngramError(f'fitted={cfg.fitted}: {e}') from None
    return
  runfolder.check_file(str(cfg.fitted))  # a fit's fitted.json: its run folder whole, the file the run's own
  try:
    fitted = json.loads(Path(cfg.fitted).read_text())
  except (OSError, json.JSONDecodeError) as e:
    raise EngramError(f'fitted={cfg.fitted}: not a readable fitted.json of experiments.fit ({e})') from None
  if not isinstance(fitted, dict) or not {'pipeline', 'folds'} <= set(fitted):
    raise EngramError(f'fitted={cfg.fitted}: expected a fitted.json of experiments.fit ({{"pipeline", "folds"}})')


def check_evaluate(cfg: DictConfig, settings: EvalConfig | None = None) -> EvalConfig:
  """Everything ``experiments.evaluate`` can check before loading data; returns the run's ``eval`` node, typed
  (``settings``: as the caller read it, default read here: :func:`experiments.lib.common.eval_settings`)."""
  check_keys(cfg)
  settings = _settings(cfg, settings)
  check_reader(cfg)
  check_fitted_file(cfg)
  k = settings.k
  check_run_settings(cfg)
  datasets = datasets_of(cfg)
  if cfg.get('datasets') and 'dataset' in cfg:
    if list(settings.metrics) != list(cfg.dataset.metrics):
      raise EngramError(
        'eval.metrics applies to one-dataset runs; in a multi-dataset run set '
        f'datasets.<name>.metrics (datasets: {list(datasets)})'
      )
  for name, ds in datasets.items():
    check_metrics(metrics_for(cfg, ds, settings), k=k, supported=list(dataset_metrics(ds)), where=f'dataset {name}')
    _check_loader(ds.get('loader'), f'datasets.{name}' if cfg.get('datasets') else 'dataset')
    check_loader_selection(ds.get('loader'), f'datasets.{name}' if cfg.get('datasets') else 'dataset')
    check_dataset_k(ds, k, f'dataset {name}')
    skipped = [n for n in cfg.pipeline if name in (cfg.pipeline[n].get('skip_datasets') or [])]
    if skipped and len(skipped) == len(cfg.pipeline):
      raise EngramError(
        f'dataset {name}: every selected pipeline skips it ({skipped}: their parameters were fit on '
        'its questions, skip_datasets), so nothing would be scored; choose another pipeline or dataset'
      )
  resolve_baselines(cfg, settings)
  train_sets = cfg.get('train_sets') or {}
  for name, node in cfg.pipeline.items():
    tune = node.get('tune')
    if tune is None:
      continue
    for t in tune.get('train') or []:
      if t not in train_sets:
        raise EngramError(f'pipeline {name}: tune.train names {t!r}; allowed: {sorted(train_sets)}')
      tcfg = train_sets[t]
      _check_loader(tcfg.get('loader'), f'train_sets.{t}')
      check_metrics([tcfg.metric], k=k, supported=list(dataset_metrics(tcfg)), where=f'train_sets.{t}.metric')
    if not tune.get('grid'):
      raise EngramError(f'pipeline {name}: tune.grid is empty; give at least one value')
    if tune.get('metric') is not None:
      ds0 = next(iter(datasets.values()))
      check_metrics([tune.metric], k=k, supported=list(dataset_metrics(ds0)), where=f'pipeline {name} tune.metric')
  return settings


def check_learning_rate(node: Any, steps: int, where: str = 'fit.optimizer.learning_rate') -> None:
  """The learning rate of a fit (``fit.optimizer.learning_rate``): a number, or an optax schedule node
  (``_target_: optax.cosine_decay_schedule``, ...) evaluated at each of the ``steps`` steps. Every rate must be
  finite and >= 0, and some rate > 0; a one-line error otherwise (a negative rate climbs the loss, a zero one
  reports an unmoved fit as fitted, a NaN one fails deep in the fit)."""
  if node is None:
    return
  if not isinstance(node, (Mapping, DictConfig)):
    if isinstance(node, bool) or not isinstance(node, (int, float)) or not 0 < node < math.inf:
      raise EngramError(f'{where} must be a finite number > 0 (or an optax schedule), got {node!r}')
    return
  if '_target_' not in node:
    return
  from hydra.utils import instantiate

  given = ', '.join(
    f'{k}={v!r}' for k, v in node.items() if k != '_target_' and not isinstance(v, Mapping | DictConfig)
  )
  try:
    rates = np.asarray(instantiate(dict(node))(np.arange(steps)), np.float64).reshape(-1)
  except Exception as e:  # noqa: BLE001 (a schedule node we cannot evaluate: what builds the fit reports it)
    log.debug('%s: not evaluated (%s)', where, e)
    return
  bad = np.flatnonzero(~np.isfinite(rates) | (rates < 0))
  if bad.size:
    i = int(bad[0])
    raise EngramError(
      f'{where} ({node["_target_"]}: {given}) must be a finite rate >= 0 at every step, got {float(rates[i])} at '
      f'step {i} ({bad.size} of {steps} steps): a negative rate climbs the loss, a NaN one fails the fit'
    )
  if not np.any(rates > 0):
    raise EngramError(
      f'{where} ({node["_target_"]}: {given}) is 0 at every one of the {steps} steps: the fit would report its '
      'starting values as fitted; set a rate > 0'
    )


def check_fit(cfg: DictConfig, settings: EvalConfig | None = None) -> Any:
  """Everything ``experiments.fit`` can check before loading data; returns the run's fit, typed
  (:class:`experiments.lib.fit_setup.FitRun`: the config is read there once, its ``fit`` node checked by
  :meth:`engram_jax.fit.config.FitConfig.from_mapping`)."""
  from experiments.lib import fit_setup  # the fit's typed settings (imported here: evaluate never needs it)

  check_keys(cfg)
  check_run_settings(cfg)
  run = fit_setup.read(cfg, settings=settings)
  f = run.config
  check_learning_rate(f.optimizer.get('learning_rate'), f.steps)
  check_metrics(list(run.metrics), k=run.k, supported=list(run.episode_metrics), where=f'dataset {run.dataset}')
  if f.split == 'parts':
    _check_loader(f.train.get('loader'), 'fit.train')
  _check_loader(cfg.dataset.get('loader'), 'dataset')
  check_loader_selection(cfg.dataset.get('loader'), 'dataset')
  check_dataset_k(cfg.dataset, run.k, f'dataset {run.dataset}')
  if run.pipeline:
    f.params_of(run.pipeline)  # nothing to fit: one line
  check_fit_folds(f, cfg.dataset.get('loader'))
  return run


def check_fit_folds(f: Any, loader: Any) -> None:
  """Cross-fitting deals the episodes into ``fit.folds`` folds, a hold-out split keeps ``fit.n_test`` of them for
  testing: an explicit episode list (``dataset.loader.conversations``) must name enough (checked before loading; the
  episodes read are checked again before embedding). ``f``: the typed fit
  (:class:`engram_jax.fit.config.FitConfig`)."""
  conv = loader.get('conversations') if loader is not None else None
  if f.split not in ('crossfit', 'holdout') or conv is None or isinstance(conv, str):
    return
  n = len(set(conv))
  named = f'dataset.loader.conversations names {n} episode(s) ({", ".join(map(str, conv))})'
  if f.split == 'crossfit' and f.folds > n:
    raise EngramError(
      f'fit.folds must be between 2 and {n} (one episode per fold at least), got {f.folds}: {named}; name more '
      'episodes, or fewer folds'
    )
  if f.split == 'holdout' and f.n_test >= n:
    raise EngramError(
      f'fit.n_test must be between 1 and {n - 1} (a hold-out split needs a training episode too), got {f.n_test}: '
      f'{named}; name more episodes, or fewer test ones'
    )


def _task_overrides(cfg: DictConfig) -> list[str]:
  """The command line's overrides of this run (Hydra's ``overrides.task``; [] outside a Hydra app)."""
  if 'hydra' in cfg and cfg.hydra.get('overrides') is not None:  # a config composed with return_hydra_config
    return list(cfg.hydra.overrides.task)
  from hydra.core.hydra_config import HydraConfig

  return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def check_listed_once(cfg: DictConfig) -> None:
  """A config group selected as a list on the command line (``pipeline=[a,b]``) names each option once: Hydra merges
  a repeated one silently (``pipeline=[cosine,cosine]`` runs one cosine row)."""
  overrides = _task_overrides(cfg)
  if not overrides:
    return
  from hydra.core.override_parser.overrides_parser import OverridesParser

  for o in OverridesParser.create().parse_overrides(overrides):
    group = o.key_or_group
    if o.is_sweep_override() or not (CONF / group).is_dir():
      continue
    value = o.value()
    if isinstance(value, list):
      names = [str(v) for v in value]
      twice = sorted({v for v in names if names.count(v) > 1})
      if twice:
        raise EngramError(
          f'{group}=[{",".join(names)}] lists {", ".join(twice)} twice: Hydra would merge them into one; name each once'
        )


def check_reader_packages(cfg: DictConfig) -> None:
  """A Tier-1 reader's packages are installed (found without importing them), checked by ``experiments.evaluate``
  right after the config checks, before loading: a missing one would otherwise fail after the retrieval. torch and
  transformers for every reader; a packaged reader's model packages (:data:`engram_jax.answer.reader.PACKAGED`), and
  ``gguf`` unless its dequantised copy is cached. Not part of :func:`check_evaluate` (what the configuration says),
  since it depends on this machine's installs; a no-op without a reader."""
  if not (cfg.get('reader') and cfg.reader.get('name', 'none') != 'none'):
    return
  import importlib.util

  from engram_jax.answer import reader as reader_lib

  name = str(cfg.reader.name)
  packaged = reader_lib.PACKAGED.get(name)
  install = packaged.install if packaged else "pip install -e '.[reader]'"
  missing = [p for p in ('torch', 'transformers') if importlib.util.find_spec(p) is None]
  if missing:
    raise EngramError(f'reader={name} needs {", ".join(missing)}, not installed; install with: {install}')
  if packaged is None:
    return
  try:
    reader_lib.packaged_parts(name)
  except FileNotFoundError as e:
    raise EngramError(f'{e} (reader={name}; or reader=none)') from None
  cached = list((Path(str(cfg.paths.cache_dir)) / 'readers').glob(f'{name}-*'))
  if importlib.util.find_spec('gguf') is None and not cached:
    raise EngramError(
      f'reader={name} reads its GGUF file through the package gguf, not installed (and no dequantised copy is '
      f'cached under {cfg.paths.cache_dir}/readers); install with: {install}'
    )
