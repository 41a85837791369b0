"""Fit a pipeline's knobs by gradient (engram_jax.fit) and score the fitted pipeline out of fold, hard.

Kept short on purpose: the logic lives in engram_jax.fit; loading, embedding and scoring are
experiments.evaluate's and engram_jax.eval.evaluation's.

Writes to the Hydra run folder: fitted.json (``{"pipeline", "folds": {episode: {config path: value}}}``, the
format ``experiments.evaluate fitted=...`` reads), loss_curve.json, split.json, results.json, results.md, the
resolved config and ``artifact/`` (every learned part of every fit: :mod:`engram_jax.fit.artifact`), each file
atomically, then ``run_complete.json`` last (the run's id and every file's sha256: :mod:`engram_jax.core.runfolder`);
a rerun into a used folder removes the old marker first, then the outputs it replaces.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import hydra
import jax
import numpy as np
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from engram_jax import fit
from engram_jax.core import batch, modules, runfolder
from engram_jax.core.errors import EngramError
from engram_jax.data import splits
from engram_jax.eval import checks as data_checks
from engram_jax.eval import evaluation, pipeline
from engram_jax.eval.config import EvalConfig
from engram_jax.fit import apply as road
from engram_jax.fit import artifact
from engram_jax.fit.config import FitConfig
from engram_jax.metrics import stats
from experiments.lib import checks, common, fit_artifact, fit_setup, protocol

log = logging.getLogger(__name__)


# what a fit writes into its run folder (an earlier run's copies are removed first: engram_jax.core.runfolder.begin),
# besides loss_curve_<label>.json of each variant of fit.variants (:func:`outputs`)
OUTPUTS = (
  'fitted.json',
  'loss_curve.json',
  'split.json',
  'results.json',
  'results.md',
  'config_resolved.yaml',
  'artifact',
)


def outputs(run: fit_setup.FitRun) -> tuple[str, ...]:
  """What this run writes into its folder: :data:`OUTPUTS` and a loss curve per declared variant."""
  labels = list(run.config.variants)
  return (*OUTPUTS[:2], *(f'loss_curve_{label}.json' for label in labels), *OUTPUTS[2:])


def stale_outputs(folder: Path) -> tuple[str, ...]:
  """An earlier fit's loss curves in ``folder`` (of variants this run may not declare): removed with the rest."""
  return tuple(sorted(p.name for p in Path(folder).glob('loss_curve_*.json')))


def reports(run: fit_setup.FitRun) -> dict[str, Any]:
  """``fit.reports``: component name -> its report module (imported), in the order they run."""
  out = {}
  for name, module in run.config.reports.items():
    out[name] = modules.import_module(module, f'fit.reports.{name}')
  return out


def _interval(values: np.ndarray, seed: int, n_resamples: int) -> dict[str, float]:
  return stats.bootstrap_ci(values, seed=seed, n_resamples=n_resamples).to_dict()


def prepare(
  cfg: DictConfig, options: dict | None = None, dataset: Mapping | None = None, episodes=None, *, progress: bool = True
):
  """Load, embed and pad a dataset once (``cfg.dataset`` unless ``dataset``; ``episodes``: already loaded;
  ``cfg``: the run's environment, its paths and embedder):
  ``(episodes, embeddings, arrays)`` (``options``: what the pipelines' legs need built,
  :func:`engram_jax.eval.pipeline.build_options`)."""
  options = options or {}
  if episodes is None:
    episodes, _ = common.load_dataset(cfg, cfg.dataset if dataset is None else dataset)
  embeddings = evaluation.embed_episodes(episodes, common.make_embedder(cfg, progress=progress))
  arrays = [batch.episode_arrays(e, d, q, **options) for e, (d, q) in zip(episodes, embeddings)]
  return episodes, embeddings, arrays


def check_twins(*args, **kwargs) -> None:
  """:func:`experiments.lib.fit_setup.check_twins` (kept here for its callers)."""
  fit_setup.check_twins(*args, **kwargs)


@dataclasses.dataclass
class GapShared:
  """What the folds' gap monitors (:func:`gap_monitor`) share: the soft program (:func:`engram_jax.fit.make_soft_eval`,
  traced once for all folds), per-question hard scores by knob values and step-0 soft scores by (scale, knob values)
  (the first check's knobs are the hand-set ones in every fold), and the rows on each device that holds a fold's knob
  values (copied there once)."""

  soft_eval: Any
  leg_cache: Any = None  # the process's leg cache (:func:`experiments.lib.common.leg_cache`), or None
  hard: dict = dataclasses.field(default_factory=dict)
  soft: dict = dataclasses.field(default_factory=dict)
  rows: dict = dataclasses.field(default_factory=dict)
  lock: Any = dataclasses.field(default_factory=threading.Lock)


def gap_monitor(
  run: fit_setup.FitRun,
  name: str,
  pipe: pipeline.Pipeline,
  problem: fit.Problem,
  rows: fit.Rows,
  episodes,
  arrays,
  fold: int,
  train: np.ndarray,
  *,
  shared: GapShared | None = None,
) -> fit.Monitor:
  """Fold ``fold``'s soft-vs-hard gap on its training questions (rows ``train``): at a step, the soft twin's
  approx-NDCG@k (temperatures as annealed at that step) and the hard pipeline's NDCG@k (same labels) with the
  knob values of that step, both averaged over the same training questions.

  The hard pipeline is scored on every episode (the fold's scored one too, then left out of the mean), so that each
  check of every fold runs one compiled program of the same shapes. ``shared`` (one :class:`GapShared` for all folds;
  default: this fold's own) keeps what the folds can share: the first check (the hand-set values, the same in every
  fold) is scored once for all folds, its soft half on every question (each row's value does not depend on the other
  rows of its batch) with each fold averaging its training questions' values."""
  shared = GapShared(fit.make_soft_eval(problem, max_gold=fit.max_gold_of(rows))) if shared is None else shared
  hard = functools.partial(_gap_hard, run, name, pipe, episodes, arrays, shared)
  soft = functools.partial(_gap_soft, run.config.batch_size, problem, rows, train, shared)

  def watch(step: int, scale: float, vals: dict) -> dict[str, float]:
    s_ = float(np.mean(soft(step, scale, vals)))
    h_ = float(np.mean(hard(fit.fitted_values(problem, vals))[train]))
    return {'soft_ndcg': s_, 'hard_ndcg': h_, 'gap': s_ - h_}

  return watch


def _gap_hard(run: fit_setup.FitRun, name: str, pipe, episodes, arrays, shared: GapShared, values: dict) -> np.ndarray:
  """The hard pipeline's NDCG@k with knob ``values`` on every question (rows' order), computed once per values."""
  key = tuple(sorted(values.items()))
  if key not in shared.hard:
    k = run.k
    r = evaluation.evaluate(
      list(episodes), None, {name: pipeline.with_values(pipe, values)}, k=k, metrics=[f'ndcg@{k}'],
      seed=run.seed, progress=False, arrays=list(arrays), leg_cache=shared.leg_cache,
    )  # fmt: skip
    row_ids = [q.id for e in episodes for q in e.questions]
    at = {q: i for i, q in enumerate(r.question_ids)}
    if len(at) != len(row_ids):
      raise AssertionError(f'gap monitor: {len(at)} hard-scored vs {len(row_ids)} questions')
    shared.hard[key] = np.asarray(r.scores[name][f'ndcg@{k}'])[[at[q] for q in row_ids]]
  return shared.hard[key]


def _rows_beside(shared: GapShared, rows: fit.Rows, vals: dict) -> fit.Rows:
  """The rows on the device that holds the knob values (a fold's device: one copy per device, made once), so that
  each soft pass reads them in place rather than copying them to that device at every batch."""
  leaf = next(iter(jax.tree_util.tree_leaves(vals)), None)
  if not isinstance(leaf, jax.Array) or len(leaf.devices()) != 1:
    return rows
  (device,) = leaf.devices()
  with shared.lock:
    if device not in shared.rows:
      shared.rows[device] = jax.device_put(rows, device)
  return shared.rows[device]


def _gap_soft(
  batch_size: int, problem, rows: fit.Rows, train: np.ndarray, shared: GapShared, step: int, scale: float, vals: dict
) -> np.ndarray:
  """The soft twin's approx-NDCG@k of the training rows at ``step``; the first check (hand-set values, the same in
  every fold) on every row once for all folds."""
  here = _rows_beside(shared, rows, vals)
  if step != 0:
    return fit.soft_ndcg_rows(shared.soft_eval, vals, here, train, scale=scale, batch_size=batch_size)
  key = (scale, tuple(sorted(fit.fitted_values(problem, vals).items())))
  with shared.lock:
    if key not in shared.soft:
      every = np.arange(rows.where.shape[0])
      shared.soft[key] = fit.soft_ndcg_rows(shared.soft_eval, vals, here, every, scale=scale, batch_size=batch_size)
  return shared.soft[key][np.asarray(train)]


def fit_variant(
  run: fit_setup.FitRun,
  env: Env,
  plan: fit_setup.Plan,
  label: str,
  pipe: pipeline.Pipeline,
  data: Data,
  checked: set | None = None,
) -> dict[str, Any]:
  """Cross-fit one variant of the plan (``fitted`` or a label of ``fit.variants``) and score each fold's episodes
  with its fit (hard, every learned part: :func:`engram_jax.fit.artifact.score`); with ``fit.final``, one more fit
  on every training question. Before step 0, each of its components passes the component contract
  (:func:`experiments.lib.fit_setup.check_contract`; ``checked``: those already checked in this run). Returns
  ``{'problem', 'components', 'fits', 'final', 'scores', 'per_fold'}`` (``env``: the machine's devices and leg
  cache)."""
  problem, components = plan.variants()[label]
  episodes, embeddings, arrays, folds = data.episodes, data.embeddings, data.arrays, data.folds
  fit_setup.check_contract(plan, problem, components, episodes, arrays, seed=run.seed, done=checked)
  rows = fit_setup.rows(plan, pipe, episodes, arrays, seed=run.seed, problem=problem)
  inputs = {c.name: c.inputs(problem, episodes, arrays) for c in components}
  monitor_steps = run.config.monitor_steps() if label == 'fitted' else []
  monitor = None
  if monitor_steps:  # one GapShared for all folds
    shared = GapShared(fit.make_soft_eval(problem, max_gold=fit.max_gold_of(rows)), env.leg_cache)
    monitor = functools.partial(gap_monitor, run, plan.name, pipe, problem, rows, episodes, arrays, shared=shared)
  fits = fit_setup.crossfit(
    plan,
    rows,
    episodes,
    folds,
    problem=problem,
    components=components,
    inputs=inputs,
    monitor=monitor,
    monitor_steps=monitor_steps,
    devices=env.devices,
  )
  final = None
  if run.config.final:  # one fit on every training question of the run (for use after cross-fitting)
    final = fit_setup.fit_rows(
      plan, rows, np.arange(rows.where.shape[0]), problem=problem, components=components, inputs=inputs
    )
  labels = [f'fold_{f:02d}' for f in range(len(folds))]
  held = artifact.in_memory(pipe, problem, plan.every, components, dict(zip(labels, fits)), dict(zip(labels, folds)))
  in_folds = [i for i, e in enumerate(episodes) if any(e.id in fold for fold in folds)]
  got = road.apply(
    held, [episodes[i] for i in in_folds], [embeddings[i] for i in in_folds], k=run.k,
    metrics=data.metrics, seed=run.seed, episode_metrics=dict(run.episode_metrics),
    arrays=[arrays[i] for i in in_folds], where=f'dataset {run.dataset}',
  )  # fmt: skip
  scores = got.scores
  return {'problem': problem, 'components': components, 'fits': fits, 'final': final, 'scores': scores}


def make_folds(config: FitConfig, episode_ids: list[str]) -> list[list[str]]:
  """Scored episode folds: cross-fitting folds, one hold-out fold, or (``parts``) every episode of the scored
  dataset in one fold (the training episodes come from ``fit.train``)."""
  if config.split == 'parts':
    return [list(episode_ids)]
  if config.split == 'crossfit':
    return fit.episode_folds(episode_ids, n_folds=config.folds, seed=config.seed)
  if config.split == 'holdout':
    return [fit.holdout_split(episode_ids, n_test=config.n_test, seed=config.seed)[1]]
  raise EngramError(f'fit.split must be crossfit, holdout or parts, got {config.split!r}')


def paired_tests(
  after: dict[str, np.ndarray],
  before,
  rows: list[str],
  metrics: list[str],
  *,
  seed: int,
  n_resamples: int,
  sel: np.ndarray | slice = slice(None),
) -> dict[str, dict[str, dict]]:
  """Fitted minus each hand-set row in ``rows`` on the questions ``sel``, every (row, metric) pair in one batched
  pass (:func:`engram_jax.metrics.stats.paired_tests`; a pair's result is the same alone or in the batch):
  ``{row: {metric: PairedResult dict}}``."""
  pairs = [(r, m) for r in rows for m in metrics]
  res = stats.paired_tests(
    np.stack([after[m][sel] for _, m in pairs]),
    np.stack([before.scores[r][m][sel] for r, m in pairs]),
    seed=seed,
    n_resamples=n_resamples,
  )
  out: dict[str, dict[str, dict]] = {r: {} for r in rows}
  for (r, m), t in zip(pairs, res):
    out[r][m] = t.to_dict()
  return out


def category_tests(
  before,
  after: dict[str, np.ndarray],
  rows: list[str],
  metrics: list[str],
  *,
  seed: int,
  n_resamples: int,
  min_questions: int = 10,
) -> dict[str, Any]:
  """Per question category (with at least ``min_questions``): the fitted mean and the paired difference to each
  hand-set row (time-sensitive subsets: LongMemEval's knowledge-update and temporal-reasoning, LoCoMo's
  category 2)."""
  cats = np.asarray([str(c) for c in before.categories])
  out = {}
  for c in sorted(set(cats)):
    sel = cats == c
    if sel.sum() < min_questions:
      continue
    out[c] = {
      'n': int(sel.sum()),
      'fitted': {m: float(np.mean(after[m][sel])) for m in metrics},
      'hand_set': {r: {m: float(np.mean(before.scores[r][m][sel])) for m in metrics} for r in rows},
      'paired': paired_tests(after, before, rows, metrics, seed=seed, n_resamples=n_resamples, sel=sel),
    }
  return out


def gap_table(folds, fits) -> dict[str, Any]:
  """The soft-vs-hard gap of every fold by step, and its mean over folds by step."""
  per_fold = {fit.fold_label(f): r.monitor for f, r in zip(folds, fits)}
  steps = sorted({m['step'] for r in fits for m in r.monitor})
  by_step = []
  for t in steps:
    at = [m for r in fits for m in r.monitor if m['step'] == t]
    by_step.append(
      {
        'step': t,
        'scale': at[0]['scale'],
        **{key: float(np.mean([m[key] for m in at])) for key in ('soft_ndcg', 'hard_ndcg', 'gap')},
      }
    )
  return {'by_step': by_step, 'per_fold': per_fold}


@dataclasses.dataclass
class Data:
  """The run's questions: episodes (training-only ones first with ``fit.split=parts``), their embeddings and padded
  arrays, the scored folds, the indices of the scored episodes and the metrics."""

  episodes: list
  embeddings: list
  arrays: list
  folds: list[list[str]]
  scored: list[int]
  metrics: list[str]


def load(cfg: DictConfig, run: fit_setup.FitRun, options: dict) -> Data:
  """Load, embed and pad the scored dataset (and ``fit.train`` with ``fit.split=parts``); folds checked disjoint by
  question id and content before any fitting (``cfg``: the run's environment, its paths, embedder and loaders)."""
  episodes, _ = common.load_dataset(cfg, cfg.dataset)
  folds = make_folds(run.config, [e.id for e in episodes])  # fit.folds / fit.n_test against the episodes read
  episodes, embeddings, arrays = prepare(cfg, options, episodes=episodes, progress=run.eval.progress)
  if run.config.split == 'parts':  # train on another part / dataset: its episodes join the rows, never a fold
    train_eps, train_emb, train_arr = prepare(cfg, options, dataset=run.config.train, progress=run.eval.progress)
    splits.assert_disjoint(
      [q.id for e in train_eps for q in e.questions], [q.id for e in episodes for q in e.questions]
    )
    splits.assert_disjoint_content(train_eps, episodes)
    if {e.id for e in train_eps} & {e.id for e in episodes}:
      raise EngramError('fit.train and the scored dataset share episode ids')
    episodes, embeddings, arrays = train_eps + episodes, train_emb + embeddings, train_arr + arrays
  data_checks.check_scored_questions(episodes, f'dataset {run.dataset}')
  data_checks.check_folds(episodes, folds)  # every fold scores >= 1 question and trains on >= 1, before any fitting
  for fold in folds:  # content-level: a copied conversation must not train the fold that scores it
    splits.assert_disjoint_content([e for e in episodes if e.id not in fold], [e for e in episodes if e.id in fold])
  scored_ids = {e for f in folds for e in f}
  scored = [i for i, e in enumerate(episodes) if e.id in scored_ids]
  return Data(episodes, embeddings, arrays, folds, scored, list(run.metrics))


def run(cfg: DictConfig, out_dir: Path, settings: EvalConfig | None = None) -> dict[str, Any]:
  """Fit ``cfg.pipeline`` (one pipeline) on ``cfg.dataset`` and score it out of fold; write the results, the
  Markdown, the artifact and the ledger row. The folder is whole or marked (:mod:`engram_jax.core.runfolder`): an
  earlier run's marker and outputs are removed first, every file is written atomically, the marker last; the run
  holds the folder (one writer: another run into it is refused) until it ends, however it ends."""
  names = list(cfg.pipeline)
  if len(names) != 1:
    raise EngramError(f'experiments.fit fits one pipeline per run, got {names} (use -m pipeline=a,b)')
  fit_run = checks.check_fit(cfg, settings)  # the config read once, typed (experiments.lib.fit_setup.FitRun)
  expect = common.hydra_own_files(out_dir)
  with runfolder.begin(out_dir, outputs(fit_run) + stale_outputs(out_dir), expect=expect) as folder:
    return _run(cfg, fit_run, out_dir, folder)


@dataclasses.dataclass(frozen=True)
class Env:
  """What a fit uses of the machine (set up from the config's ``eval`` node once): the devices its folds run on and
  the process's leg cache."""

  devices: Any
  leg_cache: Any


def _run(cfg: DictConfig, run_: fit_setup.FitRun, out_dir: Path, folder: runfolder.Run) -> dict[str, Any]:
  """:func:`run` in the folder it holds (``cfg``: the environment, its paths, caches, devices, embedder, loaders and
  protocol; ``run_``: the fit's settings, typed)."""
  t0 = time.perf_counter()
  common.enable_compile_cache(cfg)  # a warm rerun loads its programs (rows, twin checks, steps, monitors, scoring)
  name = run_.pipeline
  common.import_ops_modules(cfg)
  pipe = common.hand_set_pipeline(name, run_.pipeline_node)
  baselines = {b: common.hand_set_pipeline(b) for b in run_.config.baselines if b != name}
  plan = fit_setup.plan(run_, pipe)  # config errors before any data is loaded
  protocol_info = protocol.check(cfg)  # refuses an already-scored confirmation (unless forced)
  if protocol_info:
    protocol.warn_run_dir(out_dir)  # before the work: a row whose run folder is outside the repository says so
  data = load(cfg, run_, pipeline.build_options([pipe, *baselines.values()]))
  env = Env(common.fold_devices(run_.eval), common.leg_cache(run_.eval))
  metrics = data.metrics
  checks.check_external_runs(cfg, {name: pipe, **baselines}, data.episodes, run_.k)
  protocol.check_data(protocol_info, cfg, data.episodes)  # the data read against its pinned fingerprint (unless forced)
  t_load = time.perf_counter() - t0
  checked: set = set()  # (component, settings) whose contract passed in this run
  parts = {label: fit_variant(run_, env, plan, label, pipe, data, checked) for label in plan.variants()}
  t_fit = time.perf_counter() - t0 - t_load  # hard scoring of the folds included
  before = evaluation.evaluate(
    [data.episodes[i] for i in data.scored],
    [data.embeddings[i] for i in data.scored],
    {name: pipe, **baselines},
    k=run_.k,
    metrics=metrics,
    seed=run_.seed,
    progress=False,
    arrays=[data.arrays[i] for i in data.scored],
    episode_metrics=dict(run_.episode_metrics),
  )
  timing = {'wall_s': time.perf_counter() - t0, 'load_embed_s': t_load, 'fit_s': t_fit}
  timing.update(score_s=timing['wall_s'] - t_load - t_fit, fit_per_fold_s=[r.wall_s for r in parts['fitted']['fits']])
  results = make_results(run_, plan, data, parts, before, list(baselines), protocol_info, timing)
  text = markdown(run_, plan, data, parts, results)
  write_outputs(cfg, run_, folder, plan, data, parts, results, text)
  folder.finish()  # the marker, last: every output above and Hydra's files of the run, by sha256
  print(text)
  if protocol_info:
    record_ledger(protocol_info, out_dir, results)
  return results


def parts_of(parts: dict[str, Any], comps) -> list[str]:
  """The labels of the one-component variants of ``parts`` whose component is one of ``comps``, in their order."""
  out = []
  for c in comps:
    out += [label for label, part in parts.items() if tuple(x.name for x in part['components']) == (c.name,)]
  return out


def variant_paired(
  scores: dict[str, np.ndarray],
  scalar: dict[str, np.ndarray],
  before,
  hand_rows: list[str],
  metrics: list[str],
  *,
  seed: int,
  n_resamples: int,
  label: str,
  others: dict[str, dict[str, np.ndarray]] | None = None,
) -> dict[str, Any]:
  """Variant ``label`` minus the scalar fit, minus each of ``others`` (more rows by name, e.g. the one-component
  fits of the same run) and minus each hand-set row, paired (bootstrap CI, sign-flip p)."""
  others = {
    'scalar fit (out of fold)': scalar,
    **(others or {}),
    **{f'{r} (hand-set)': before.scores[r] for r in hand_rows},
  }
  pairs = [(r, m) for r in others for m in metrics]
  res = stats.paired_tests(
    np.stack([scores[m] for _, m in pairs]),
    np.stack([others[r][m] for r, m in pairs]),
    seed=seed,
    n_resamples=n_resamples,
  )
  out: dict[str, dict] = {f'{label} - {r}': {} for r in others}
  for (r, m), t in zip(pairs, res):
    out[f'{label} - {r}'][m] = t.to_dict()
  return out


def variant_section(run: fit_setup.FitRun, plan, label: str, comps, results: dict, metrics: list[str]) -> list[str]:
  """Markdown lines of one variant's results: its components' header (their report's, or their names), its row,
  its paired differences, then each component's report lines (``tail``)."""
  name, hooks, nodes = plan.name, reports(run), plan.nodes
  mine = [(c, hooks.get(c.name)) for c in comps]
  if len(comps) == 1 and mine[0][1] is not None:
    head = mine[0][1].header(name, comps[0], nodes[comps[0].name])
  else:
    names = [c.name for c in comps]
    head = (
      f'{" + ".join(names)} in one fit (fit.variants.{label}; the specs of '
      + ' and '.join(f'fit.{n}' for n in names)
      + '):'
    )
  row = f'{name} ({label}, out of fold)'
  lines = [
    '',
    head,
    '',
    '| row | ' + ' | '.join(f'{m} [95% CI]' for m in metrics) + ' |',
    '|---|' + '---|' * len(metrics),
    common.md_mean_row(row, results['summary'][row], metrics),
    '',
    '| paired difference | ' + ' | '.join(f'{m} delta [95% CI], p' for m in metrics) + ' |',
    '|---|' + '---|' * len(metrics),
  ]
  lines += [common.md_paired_row(r, t, metrics) for r, t in results['paired'].items() if r.startswith(f'{label} - ')]
  for c_name, hook in hooks.items():
    for c in comps:
      if c.name == c_name:
        lines += hook.tail(c, nodes[c.name], results['variants'][label], len(comps) == 1)
  return lines


def make_results(
  run: fit_setup.FitRun, plan, data: Data, parts, before, baselines: list[str], protocol_info, timing
) -> dict[str, Any]:
  """results.json: every row's mean and CI, the paired differences, per category, per question, the fits."""
  name, metrics, folds = plan.name, data.metrics, data.folds
  episodes = data.episodes
  for fold in folds:  # the disjointness the fits asserted, asserted again on what is written
    splits.assert_disjoint(
      [q.id for e in episodes if e.id not in fold for q in e.questions],
      [q.id for e in episodes if e.id in fold for q in e.questions],
    )
  after, fits = parts['fitted']['scores'], parts['fitted']['fits']
  seed, nres = run.seed, run.n_resamples
  rows = {f'{name} (hand-set)': before.scores[name], f'{name} (fitted, out of fold)': after}
  rows.update({f'{b} (hand-set)': before.scores[b] for b in baselines})
  summary = {r: {m: _interval(v[m], seed, nres) for m in metrics} for r, v in rows.items()}
  hand_rows = [name, *baselines]
  paired = {
    f'fitted - {r} (hand-set)': v
    for r, v in paired_tests(after, before, hand_rows, metrics, seed=seed, n_resamples=nres).items()
  }
  by_category = category_tests(before, after, hand_rows, metrics, seed=seed, n_resamples=nres)
  extra = variant_results(run, plan, data, parts, before, hand_rows, summary, paired)
  primary = (protocol_info or {}).get('primary_metric') or metrics[0]
  hand = {r: v[primary]['mean'] for r, v in summary.items() if r.endswith('(hand-set)')}
  best = max(hand, key=hand.get)
  return {
    'pipeline': name,
    'protocol': protocol_info,
    'params': [p for p, _ in plan.problem.fitted],
    'hand_set': plan.every,
    'n_questions': len(after[metrics[0]]),
    'metrics': metrics,
    'summary': summary,
    'paired': paired,
    'fitted': {ep: res.values for fold, res in zip(folds, fits) for ep in fold},
    'timing': timing,
    'anneal': list(plan.anneal),
    'soft_hard_gap': gap_table(folds, fits),
    'by_category': by_category,
    'steps': plan.steps,
    'batch_size': plan.batch_size,
    'per_question': {
      'question_ids': before.question_ids,
      'episode_ids': before.episode_ids,
      'fitted': {m: after[m].tolist() for m in metrics},
      'hand_set': {m: before.scores[name][m].tolist() for m in metrics},
      'baselines': {b: {m: before.scores[b][m].tolist() for m in metrics} for b in baselines},
      'categories': [str(c) for c in before.categories],
    },
    'variants': extra,  # each variant's section under its own label, apart from the keys above
    'best_hand_set': {'row': best, 'metric': primary, 'value': hand[best]},
  }


def variant_results(
  run: fit_setup.FitRun, plan, data: Data, parts, before, hand_rows: list[str], summary: dict, paired: dict
) -> dict:
  """Each variant with components: its row (added to ``summary``), its paired differences (added to ``paired``:
  against the scalar fit, the hand-set rows and, for a fit of several components, each one-component variant of its
  parts) and its section of results.json (``variants``: spec, its components' report extras, scalars, per question)."""
  name, metrics, folds = plan.name, data.metrics, data.folds
  after = parts['fitted']['scores']
  seed, nres = run.seed, run.n_resamples
  extra: dict[str, Any] = {}
  hooks = reports(run)
  for label, part in parts.items():
    comps = part['components']
    if not comps:
      continue
    summary[f'{name} ({label}, out of fold)'] = {m: _interval(part['scores'][m], seed, nres) for m in metrics}
    # a fit of several components is paired with each one-component variant of its parts too
    alone = {f'{p} (out of fold)': parts[p]['scores'] for p in parts_of(parts, comps)} if len(comps) > 1 else {}
    paired.update(
      variant_paired(
        part['scores'], after, before, hand_rows, metrics, seed=seed, n_resamples=nres, label=label, others=alone
      )
    )
    nodes = plan.nodes
    extra[label] = {'spec': nodes[comps[0].name] if len(comps) == 1 else {c.name: nodes[c.name] for c in comps}}
    by_name = {c.name: c for c in comps}
    for c_name, hook in hooks.items():  # each component's own extras, in the order of fit.reports
      if c_name in by_name:
        extra[label].update(hook.extras(run, plan, data, part, by_name[c_name], len(comps) == 1))
    extra[label].update(
      {
        'scalars': {fit.fold_label(f): r.values for f, r in zip(folds, part['fits'])},
        'fit_per_fold_s': [r.wall_s for r in part['fits']],
        'per_question': {m: part['scores'][m].tolist() for m in metrics},
      }
    )
  return extra


def markdown(run: fit_setup.FitRun, plan, data: Data, parts, results: dict[str, Any]) -> str:
  """results.md: the rows, the paired differences, per category, the fitted knobs, the gap, the components."""
  name, metrics, summary, folds = plan.name, data.metrics, results['summary'], data.folds
  scalar_rows = [r for r in summary if not r.endswith(tuple(f'({v}, out of fold)' for v in parts if v != 'fitted'))]
  lines = [
    f'### {run.dataset}: {name} fitted by gradient ({run.config.split}, {len(folds)} folds, '
    f'{results["n_questions"]} questions scored out of fold), k={run.k}',
    '',
    '| pipeline | ' + ' | '.join(f'{m} [95% CI]' for m in metrics) + ' |',
    '|---|' + '---|' * len(metrics),
  ]
  lines[1:1] = protocol.markdown_lines(results.get('protocol'))  # a forced protocol run says so under its title
  lines += [common.md_mean_row(r, summary[r], metrics) for r in summary]
  lines += ['', '| paired difference | ' + ' | '.join(f'{m} delta [95% CI], p' for m in metrics) + ' |']
  lines += ['|---|' + '---|' * len(metrics)]
  lines += [common.md_paired_row(r, v, metrics) for r, v in results['paired'].items()]
  lines += category_lines(results, scalar_rows)
  best = results['best_hand_set']
  lines += ['', f'Best hand-set row on these questions by {best["metric"]}: {best["row"]} ({best["value"]:.4f}).']
  fitted_paths = [p for p, _ in plan.problem.fitted]
  lines += [
    '',
    f'Fitted knobs ({", ".join(fitted_paths)}; hand-set: { {p: plan.every[p] for p in fitted_paths} }):',
    '',
  ]
  for fold, res in zip(folds, parts['fitted']['fits']):
    lines.append(f'- {fit.fold_label(fold)}: ' + ', '.join(f'{p}={v:.4g}' for p, v in res.values.items()))
  lines += gap_lines(results['soft_hard_gap'])
  for label, part in parts.items():
    if part['components']:
      lines += variant_section(run, plan, label, part['components'], results, metrics)
  t = results['timing']
  lines += [
    '',
    f'Wall time {t["wall_s"]:.1f}s (load+embed {t["load_embed_s"]:.1f}s, fit {t["fit_s"]:.1f}s, hard scoring '
    f'{t["score_s"]:.1f}s); {plan.steps} steps x {plan.batch_size} questions per fold.',
    '',
  ]
  return '\n'.join(lines)


def category_lines(results: dict[str, Any], scalar_rows: list[str]) -> list[str]:
  """results.md's per-category table: the fitted row minus each hand-set row (paired, 95% CI, p)."""
  lines: list[str] = []
  primary, by_category = results['best_hand_set']['metric'], results['by_category']
  hand_rows = [r[: -len(' (hand-set)')] for r in scalar_rows if r.endswith('(hand-set)')]
  if len(by_category) > 1:
    lines += ['', f'By category ({primary}; fitted minus each hand-set row, paired, 95% CI, p):', '']
    lines += ['| category | n | fitted | ' + ' | '.join(f'- {r}' for r in hand_rows) + ' |']
    lines += ['|---|---|---|' + '---|' * len(hand_rows)]
    for c, v in by_category.items():
      cells = [
        f'{t[primary]["delta"]:+.4f} [{t[primary]["lo"]:+.4f}, {t[primary]["hi"]:+.4f}], {t[primary]["p"]:.3g}'
        for t in v['paired'].values()
      ]
      lines.append(f'| {c} | {v["n"]} | {v["fitted"][primary]:.4f} | ' + ' | '.join(cells) + ' |')
  return lines


def gap_lines(gap: dict[str, Any]) -> list[str]:
  """results.md's soft-vs-hard gap table (when the monitor ran)."""
  lines: list[str] = []
  if gap['by_step']:
    lines += [
      '',
      'Soft-vs-hard gap on the training questions (mean over folds; soft = approx-NDCG@k of the soft twin '
      "at that step's temperatures, hard = NDCG@k of the hard pipeline with that step's knobs):",
      '',
      '| step | temperature factor | soft | hard | soft - hard |',
      '|---|---|---|---|---|',
    ]
    lines += [
      f'| {r["step"]} | {r["scale"]:.3g} | {r["soft_ndcg"]:.4f} | {r["hard_ndcg"]:.4f} | {r["gap"]:+.4f} |'
      for r in gap['by_step']
    ]
  return lines


def split_record(config: FitConfig, data: Data) -> dict[str, Any]:
  """split.json: each fold's scored and training episodes and questions."""
  episodes = data.episodes
  return {
    'kind': config.split,
    'seed': config.seed,
    'folds': [
      {
        'scored_episodes': list(f),
        'train_episodes': sorted({e.id for e in episodes} - set(f)),
        'n_train_questions': sum(len(e.questions) for e in episodes if e.id not in f),
        'scored_questions': [q.id for e in episodes if e.id in f for q in e.questions],
      }
      for f in data.folds
    ],
  }


def write_outputs(
  cfg: DictConfig, run: fit_setup.FitRun, folder: runfolder.Run, plan, data: Data, parts, results, text: str
) -> None:
  """fitted.json, loss curves, split.json, results.json / .md, the resolved config (``cfg``, as run) and the
  artifact, each written atomically into the run's folder (:func:`engram_jax.core.runfolder.begin`; the caller
  writes the marker)."""
  out_dir = folder.folder
  folds = data.folds
  files = {
    'fitted.json': json.dumps({'pipeline': plan.name, 'folds': results['fitted']}, indent=1),
    'loss_curve.json': json.dumps({','.join(f): r.losses for f, r in zip(folds, parts['fitted']['fits'])}),
    'split.json': json.dumps(split_record(run.config, data), indent=1),
    'results.json': json.dumps(results, indent=1),
    'results.md': text,
    'config_resolved.yaml': OmegaConf.to_yaml(cfg, resolve=True),
  }
  for label, part in parts.items():
    if part['components']:
      files[f'loss_curve_{label}.json'] = json.dumps({','.join(f): r.losses for f, r in zip(folds, part['fits'])})
  folder.write_files(files)
  array_pipes = [plan.name, *(b for b in run.config.baselines if b != plan.name)]
  fit_artifact.write(run, out_dir / 'artifact', plan, data, parts, results.get('protocol'), array_pipes)
  log.info('wrote %s', out_dir / 'fitted.json')


def record_ledger(protocol_info: dict[str, Any], out_dir: Path, results: dict[str, Any]) -> None:
  """The protocol's ledger row: every row's mean, every paired difference (delta, CI, p)."""
  metrics, summary, paired = results['metrics'], results['summary'], results['paired']
  protocol.record(
    protocol_info,
    out_dir,
    summary={r: {m: v[m]['mean'] for m in metrics} for r, v in summary.items()},
    paired={r: {m: {k: v[m][k] for k in ('delta', 'lo', 'hi', 'p')} for m in metrics} for r, v in paired.items()},
    n_questions=results['n_questions'],
  )


@hydra.main(version_base='1.3', config_path='../conf', config_name='fit')
@common.plain_errors  # the project's errors (EngramError) as one line; ENGRAM_FULL_ERROR=1 for the traceback
def main(cfg: DictConfig) -> float:
  settings = common.eval_settings(cfg)  # the eval node, typed, read once for the run
  common.use_cpu_cores(settings, multirun=HydraConfig.get().mode == RunMode.MULTIRUN)  # before JAX's first computation
  results = run(cfg, Path(HydraConfig.get().runtime.output_dir), settings)
  key = next(k for k in results['summary'] if k.endswith('(fitted, out of fold)'))
  return float(results['summary'][key][results['metrics'][0]]['mean'])


if __name__ == '__main__':
  main()
