"""Config validation for the entry points, run before any data is loaded or embedded.

Each check raises ``ValueError`` with one line that names the option and the allowed values. Operator knob ranges
are checked by the library when a pipeline is built (:mod:`engram_jax.core.validation`); this module checks what only
the config knows: metrics per dataset, baselines, training sets, splits and fitting settings.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from engram_jax.core import validation
from engram_jax.metrics import labels as metrics_lib
from experiments.lib.common import dataset_metrics

AUTO = 'auto'
DEFAULT_BASELINES = ('cosine', 'rrf_cos_bm25')
PARTS = ('all', 'pilot', 'train', 'confirm')
SPLITS = ('crossfit', 'holdout', 'parts')


def datasets_of(cfg: DictConfig) -> dict[str, DictConfig]:
  """The scored datasets of a run: ``cfg.datasets`` when set, else ``{cfg.dataset.name: cfg.dataset}``."""
  return dict(cfg.datasets) if cfg.get('datasets') else {cfg.dataset.name: cfg.dataset}


def metrics_for(cfg: DictConfig, ds: DictConfig) -> list[str]:
  """The metrics scored on dataset ``ds``: ``eval.metrics`` in a one-dataset run (it defaults to the dataset's
  own list), the dataset's list in a multi-dataset run."""
  if cfg.get('datasets'):
    return list(ds.metrics)
  return list(cfg.eval.metrics)


KNOWN_EPISODE_METRICS = ('answer', 'newest_first', 'parent_recall')


def check_metrics(names: list[str], *, k: int, supported: list[str], where: str) -> None:
  """Every metric parses, its cutoff is <= k, and a dataset-owned metric is one the dataset declares."""
  if not names:
    raise ValueError(f'{where}: no metrics given; expected names such as ndcg@10')
  for m in names:
    try:
      base, cut = metrics_lib.parse_metric(m, tuple(supported) + KNOWN_EPISODE_METRICS)
    except ValueError:
      allowed = sorted(metrics_lib.METRICS) + sorted(supported)
      raise ValueError(f'{where}: unknown metric {m!r}; allowed: {allowed} followed by @k') from None
    if base not in metrics_lib.METRICS and base not in supported:
      raise ValueError(
        f'{where}: metric {m!r} cannot be computed on this dataset; its dataset-owned metrics are '
        f'{sorted(supported)} (label metrics {sorted(metrics_lib.METRICS)} always can)'
      )
    if not 1 <= cut <= k:
      raise ValueError(f'{where}: metric {m!r} needs cutoff {cut}, but eval.k={k}; allowed cutoffs 1..{k}')


def check_scored_questions(episodes, where: str) -> int:
  """The number of questions to score in ``episodes``; a one-line error when there are none (a scored set of 0
  questions would give empty means and zero paired differences)."""
  n = sum(len(e.questions) for e in episodes)
  if n == 0:
    raise ValueError(
      f'{where}: 0 questions to score after loading ({len(episodes)} episodes; see the load '
      'report for what was left out)'
    )
  return n


def check_distinct_corpora(episodes, where: str) -> None:
  """Refuse two episodes with identical content (:func:`engram_jax.data.splits.corpus_fingerprint`: the same
  item texts, e.g. a conversation copied under a new id), which would be scored twice; names both."""
  from engram_jax.data import splits

  seen: dict[str, str] = {}
  for e in episodes:
    fp = splits.corpus_fingerprint(e)
    if fp in seen:
      raise ValueError(
        f'{where}: episodes {seen[fp]!r} and {e.id!r} have identical content (the same corpus '
        'fingerprint: a copy under another id) and would be scored twice; remove one'
      )
    seen[fp] = e.id


def check_folds(episodes, folds: list[list[str]]) -> None:
  """Every fold of a fit scores at least one question and trains on at least one (before any fitting)."""
  n_q = {e.id: len(e.questions) for e in episodes}
  total = sum(n_q.values())
  for fold in folds:
    scored = sum(n_q.get(e, 0) for e in fold)
    if scored == 0:
      raise ValueError(
        f'fold {sorted(fold)}: its scored episodes have 0 questions, so it would score nothing '
        '(choose other episodes, fit.n_test or fit.seed)'
      )
    if total - scored == 0:
      raise ValueError(
        f'fold {sorted(fold)}: the episodes outside it have 0 questions, so there is nothing to '
        'fit on (fewer folds, or more episodes with questions)'
      )


def resolve_baselines(cfg: DictConfig) -> list[str]:
  """``eval.baselines``: ``auto`` (the default) = those of cosine and rrf_cos_bm25 that are in the run; an explicit
  list must name pipelines of the run."""
  chosen = cfg.eval.get('baselines', AUTO)
  names = list(cfg.pipeline)
  if chosen is None or chosen == AUTO:
    return [b for b in DEFAULT_BASELINES if b in names]
  chosen = list(chosen)
  unknown = [b for b in chosen if b not in names]
  if unknown:
    raise ValueError(f'eval.baselines names {unknown}, which are not in this run; allowed: {names} (or auto)')
  return chosen


def _check_loader(loader: Any, where: str) -> None:
  part = loader.get('part') if loader is not None else None
  if part is None:
    return
  if part not in PARTS:
    raise ValueError(f'{where}.loader.part must be one of {list(PARTS)}, got {part!r}')
  n_train = loader.get('n_train')
  if part == 'train' and n_train is not None and int(n_train) < 1:
    raise ValueError(f'{where}.loader.n_train must be >= 1 (an empty training split), got {n_train}')


def check_run_settings(cfg: DictConfig) -> None:
  """The settings every entry point shares: ``seed`` (a NumPy seed: an integer >= 0) and ``eval.n_resamples``
  (bootstrap and permutation resamples: an integer >= 1)."""
  seed = cfg.get('seed')
  if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
    raise ValueError(f'seed must be an integer >= 0, got {seed!r}')
  n = cfg.eval.get('n_resamples')
  if isinstance(n, bool) or not isinstance(n, int) or n < 1:
    raise ValueError(
      f'eval.n_resamples must be an integer >= 1 (resamples of the intervals and paired tests), got {n!r}'
    )


def check_dataset_k(ds: DictConfig, k: int, where: str) -> None:
  """A dataset's own lower bound on ``eval.k`` (``min_k``: e.g. LongMemEval's turn->session metrics need the top
  turns to cover k sessions), checked before any work."""
  min_k = ds.get('min_k')
  if min_k is not None and k < int(min_k):
    raise ValueError(
      f'{where}: its metrics need eval.k >= {min_k} (the ranking must reach that deep), got '
      f'eval.k={k}; set eval.k={min_k}'
    )


def check_loader_selection(loader: Any, where: str) -> None:
  """An explicit selection of episodes (``loader.conversations``) must name at least one."""
  if loader is None:
    return
  conv = loader.get('conversations')
  if conv is not None and len(conv) == 0:
    raise ValueError(f'{where}.loader.conversations is empty (nothing to score); give at least one id, or null for all')


def check_evaluate(cfg: DictConfig) -> None:
  """Everything ``experiments.evaluate`` can check before loading data."""
  k = int(cfg.eval.k)
  if k < 1:
    raise ValueError(f'eval.k must be an integer >= 1, got {cfg.eval.k}')
  check_run_settings(cfg)
  datasets = datasets_of(cfg)
  if cfg.get('datasets') and 'dataset' in cfg:
    explicit = OmegaConf.to_container(cfg.eval, resolve=True).get('metrics')
    if explicit != list(cfg.dataset.metrics):
      raise ValueError(
        'eval.metrics applies to one-dataset runs; in a multi-dataset run set '
        f'datasets.<name>.metrics (datasets: {list(datasets)})'
      )
  for name, ds in datasets.items():
    check_metrics(metrics_for(cfg, ds), k=k, supported=list(dataset_metrics(ds)), where=f'dataset {name}')
    _check_loader(ds.get('loader'), f'datasets.{name}' if cfg.get('datasets') else 'dataset')
    check_loader_selection(ds.get('loader'), f'datasets.{name}' if cfg.get('datasets') else 'dataset')
    check_dataset_k(ds, k, f'dataset {name}')
    skipped = [n for n in cfg.pipeline if name in (cfg.pipeline[n].get('skip_datasets') or [])]
    if skipped and len(skipped) == len(cfg.pipeline):
      raise ValueError(
        f'dataset {name}: every selected pipeline skips it ({skipped}: their parameters were fit on '
        'its questions, skip_datasets), so nothing would be scored; choose another pipeline or dataset'
      )
  resolve_baselines(cfg)
  train_sets = cfg.get('train_sets') or {}
  for name, node in cfg.pipeline.items():
    tune = node.get('tune')
    if tune is None:
      continue
    for t in tune.get('train') or []:
      if t not in train_sets:
        raise ValueError(f'pipeline {name}: tune.train names {t!r}; allowed: {sorted(train_sets)}')
      tcfg = train_sets[t]
      _check_loader(tcfg.get('loader'), f'train_sets.{t}')
      check_metrics([tcfg.metric], k=k, supported=list(dataset_metrics(tcfg)), where=f'train_sets.{t}.metric')
    if not tune.get('grid'):
      raise ValueError(f'pipeline {name}: tune.grid is empty; give at least one value')
    if tune.get('metric') is not None:
      ds0 = next(iter(datasets.values()))
      check_metrics([tune.metric], k=k, supported=list(dataset_metrics(ds0)), where=f'pipeline {name} tune.metric')


def check_fit(cfg: DictConfig) -> None:
  """Everything ``experiments.fit`` can check before loading data."""
  f = cfg.fit
  check_run_settings(cfg)
  if f.split not in SPLITS:
    raise ValueError(f'fit.split must be one of {list(SPLITS)}, got {f.split!r}')
  if f.split == 'crossfit' and int(f.folds) < 2:
    raise ValueError(f'fit.folds must be >= 2 for cross-fitting, got {f.folds}')
  if f.split == 'parts' and not f.get('train'):
    raise ValueError(
      'fit.split=parts fits on fit.train (a dataset node, e.g. the train part of the scored '
      'benchmark) and scores cfg.dataset; fit.train is not set'
    )
  if f.split == 'parts':
    _check_loader(f.train.get('loader'), 'fit.train')
  if f.split == 'holdout' and int(f.n_test) < 1:
    raise ValueError(f'fit.n_test must be >= 1 (an empty test split scores nothing), got {f.n_test}')
  for key in ('steps', 'batch_size', 'greedy_pool', 'candidates'):
    if int(f[key]) < 1:
      raise ValueError(f'fit.{key} must be an integer >= 1, got {f[key]}')
  validation.check_positive(OmegaConf.to_container(f.temperatures), where='fit.temperatures')
  anneal = list(f.get('anneal') or [1.0, 1.0])
  if len(anneal) != 2:
    raise ValueError(f'fit.anneal must be [start, end] (temperature factors of the first and last step), got {anneal}')
  validation.check_positive({'start': anneal[0], 'end': anneal[1]}, where='fit.anneal')
  if int(f.get('gap_checks') or 0) < 0:
    raise ValueError(f'fit.gap_checks must be >= 0 (0 = no soft-vs-hard gap), got {f.gap_checks}')
  check_metrics(
    list(cfg.dataset.get('metrics') or cfg.eval.metrics),
    k=int(cfg.eval.k),
    supported=list(dataset_metrics(cfg.dataset)),
    where=f'dataset {cfg.dataset.name}',
  )
  _check_loader(cfg.dataset.get('loader'), 'dataset')
  check_loader_selection(cfg.dataset.get('loader'), 'dataset')
  check_dataset_k(cfg.dataset, int(cfg.eval.k), f'dataset {cfg.dataset.name}')
  names = list(cfg.pipeline)
  if len(names) == 1 and not (f.params or (f.params_by_pipeline or {}).get(names[0])):
    raise ValueError(
      f'nothing to fit: set fit.params or fit.params_by_pipeline.{names[0]}; pipelines with '
      f'entries: {sorted(f.params_by_pipeline or {})}'
    )
