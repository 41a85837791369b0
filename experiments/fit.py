"""Fit a pipeline's knobs by gradient (engram_jax.fit) and score the fitted pipeline out of fold, hard.

Kept short on purpose: the logic lives in engram_jax.fit; loading, embedding and scoring are
experiments.evaluate's and engram_jax.eval.evaluation's.

Writes to the Hydra run folder: fitted.json (``{"pipeline", "folds": {episode: {config path: value}}}``, the
format ``experiments.evaluate fitted=...`` reads), loss_curve.json, split.json, results.json, results.md and
the resolved config.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from engram_jax import fit
from engram_jax.core import batch
from engram_jax.data import splits
from engram_jax.eval import evaluation, pipeline
from engram_jax.fit import twins
from engram_jax.metrics import report, stats
from experiments.lib import checks, common, fit_adapter, fit_conditioned, protocol

log = logging.getLogger(__name__)


def _interval(values: np.ndarray, seed: int, n_resamples: int) -> dict[str, float]:
  return stats.bootstrap_ci(values, seed=seed, n_resamples=n_resamples).to_dict()


def prepare(cfg: DictConfig, options: dict | None = None, dataset: DictConfig | None = None):
  """Load, embed and pad a dataset once (``cfg.dataset`` unless ``dataset``): ``(episodes, embeddings, arrays)``
  (``options``: what the pipelines' legs need built, :func:`engram_jax.eval.pipeline.build_options`)."""
  options = options or {}
  episodes, _ = common.load_dataset(cfg, cfg.dataset if dataset is None else dataset)
  embeddings = evaluation.embed_episodes(episodes, common.make_embedder(cfg))
  arrays = [batch.episode_arrays(e, d, q, **options) for e, (d, q) in zip(episodes, embeddings)]
  return episodes, embeddings, arrays


def make_folds(cfg: DictConfig, episode_ids: list[str]) -> list[list[str]]:
  """Scored episode folds: cross-fitting folds, one hold-out fold, or (``parts``) every episode of the scored
  dataset in one fold (the training episodes come from ``fit.train``)."""
  if cfg.fit.split == 'parts':
    return [list(episode_ids)]
  if cfg.fit.split == 'crossfit':
    return fit.episode_folds(episode_ids, n_folds=int(cfg.fit.folds), seed=int(cfg.fit.seed))
  if cfg.fit.split == 'holdout':
    return [fit.holdout_split(episode_ids, n_test=int(cfg.fit.n_test), seed=int(cfg.fit.seed))[1]]
  raise ValueError(f'fit.split must be crossfit or holdout, got {cfg.fit.split!r}')


def fit_folds(cfg: DictConfig, name: str, pipe: pipeline.Pipeline, episodes, arrays, folds):
  """Fit ``pipe`` once per fold (on every episode outside it); returns ``(problem, every knob, fits)``."""
  params = list(cfg.fit.params or cfg.fit.params_by_pipeline[name])
  problem, knobs, every = fit.make_problem(
    pipe,
    params,
    k=int(cfg.eval.k),
    temperatures=fit.Temperatures(**cfg.fit.temperatures),
    settings=fit.Settings(
      greedy_pool=int(cfg.fit.greedy_pool),
      candidates=int(cfg.fit.candidates),
      solve_batch=cfg.fit.solve_batch,
      cfsr_grad=str(cfg.fit.cfsr_grad),
    ),
  )
  rows = fit.build_rows(problem, pipe, episodes, arrays, seed=int(cfg.seed))
  if cfg.fit.get('check_twins', True):
    check_twins(
      problem,
      rows,
      episodes,
      arrays,
      every,
      seed=int(cfg.seed),
      max_questions=int(cfg.fit.get('check_twins_questions') or 512),
    )
  row_eps = [e.id for e in episodes for _ in e.questions]
  qids = [q.id for e in episodes for q in e.questions]
  steps, checks_n = int(cfg.fit.steps), int(cfg.fit.get('gap_checks') or 0)
  monitor_steps = sorted({round(i * steps / checks_n) for i in range(checks_n + 1)}) if checks_n else []
  monitor = functools.partial(gap_monitor, cfg, name, pipe, problem, rows, episodes, arrays) if checks_n else None
  fits = fit.crossfit(
    problem,
    knobs,
    every,
    rows,
    row_episodes=row_eps,
    question_ids=qids,
    folds=folds,
    optimizer=instantiate(cfg.fit.optimizer),
    steps=steps,
    batch_size=int(cfg.fit.batch_size),
    seed=int(cfg.fit.seed),
    log=log.info,
    anneal=tuple(cfg.fit.get('anneal') or (1.0, 1.0)),
    monitor=monitor,
    monitor_steps=monitor_steps,
  )
  return problem, every, fits


def check_twins(
  problem: fit.Problem, rows: fit.Rows, episodes, arrays, every: dict[str, float], *, seed: int, max_questions: int
) -> None:
  """Before step 0: every fitted leg's soft twin, cold, against its hard leg (:mod:`engram_jax.fit.twins`) on the
  training rows of the first episodes (up to ``max_questions`` questions), at the hand-set knob values and with
  every fitted knob moved once. Raises a one-line ValueError naming the operator and the gap when they differ
  (``fit.check_twins=false`` skips the check)."""
  n_questions = [len(e.questions) for e in episodes]
  sel, total = [], 0
  for e, n in enumerate(n_questions):
    if total >= max_questions:
      break
    sel.append(e)
    total += n
  moved = dict(every)
  for l in range(len(problem.legs)):
    moved = twins.moved_values(problem, l, moved)
  for at, vals in (('hand-set', every), ('moved', moved)):
    for gap in twins.cold_twin_gaps(problem, rows, arrays, n_questions, vals, seed=seed, at=at, episode_index=sel):
      log.info(
        'twin check: %s',
        gap.message()
        if not gap.ok
        else f'operator {gap.op} (leg {gap.leg}, {at}): cold soft twin == hard leg on {gap.n_questions} questions '
        f'(max |soft - hard| {gap.max_diff:.3g})',
      )
      if not gap.ok:
        hint = (
          f' (a relaxed greedy leg picks among the cosine top fit.greedy_pool={problem.settings.greedy_pool} '
          'items, its hard leg among its own pool: a larger fit.greedy_pool may close the gap)'
          if gap.selection
          else ''
        )
        raise ValueError(
          f'refusing to fit: {gap.message()}{hint}; fix the soft twin (engram_jax.testing.'
          f'check_operator({gap.op!r}) runs the full check) or set fit.check_twins=false'
        )


def gap_monitor(
  cfg: DictConfig,
  name: str,
  pipe: pipeline.Pipeline,
  problem: fit.Problem,
  rows: fit.Rows,
  episodes,
  arrays,
  fold: int,
  train: np.ndarray,
) -> fit.Monitor:
  """Fold ``fold``'s soft-vs-hard gap on its training questions (rows ``train``): at a step, the soft twin's
  approx-NDCG@k (temperatures as annealed at that step) and the hard pipeline's NDCG@k (same labels) with the
  knob values of that step, both averaged over the same training questions."""
  k = int(cfg.eval.k)
  soft_eval = fit.make_soft_eval(problem, max_gold=fit.max_gold_of(rows))
  train_eps = set(np.asarray([e.id for e in episodes for _ in e.questions])[train])
  sel = [i for i, e in enumerate(episodes) if e.id in train_eps]

  def watch(step: int, scale: float, vals: dict) -> dict[str, float]:
    del step
    soft = fit.soft_ndcg_rows(soft_eval, vals, rows, train, scale=scale, batch_size=int(cfg.fit.batch_size))
    values = fit.fitted_values(problem, vals)
    r = evaluation.evaluate(
      [episodes[i] for i in sel],
      None,
      {name: pipeline.with_values(pipe, values)},
      k=k,
      metrics=[f'ndcg@{k}'],
      seed=int(cfg.seed),
      progress=False,
      arrays=[arrays[i] for i in sel],
      leg_cache=common.leg_cache(cfg),
    )
    hard = float(np.mean(r.scores[name][f'ndcg@{k}']))
    if len(r.question_ids) != len(train):
      raise AssertionError(f'gap monitor: {len(r.question_ids)} hard-scored vs {len(train)} training questions')
    return {'soft_ndcg': float(np.mean(soft)), 'hard_ndcg': hard, 'gap': float(np.mean(soft)) - hard}

  return watch


def score_folds(
  cfg: DictConfig, name: str, pipe: pipeline.Pipeline, episodes, embeddings, arrays, folds, fits, metrics: list[str]
) -> dict[str, np.ndarray]:
  """Hard per-question scores of the fitted pipeline, each fold's episodes with that fold's knobs, in the
  order of the scored episodes (as they appear in ``episodes``)."""
  by_ep: dict[str, dict[str, np.ndarray]] = {}
  for fold, res in zip(folds, fits):
    sel = [i for i, e in enumerate(episodes) if e.id in fold]
    r = evaluation.evaluate(
      [episodes[i] for i in sel],
      [embeddings[i] for i in sel],
      {name: pipeline.with_values(pipe, res.values)},
      k=int(cfg.eval.k),
      metrics=metrics,
      seed=int(cfg.seed),
      progress=False,
      arrays=[arrays[i] for i in sel],
      episode_metrics=common.dataset_metrics(cfg.dataset),
    )
    eps = np.asarray(r.episode_ids)
    for i in sel:
      by_ep[episodes[i].id] = {m: r.scores[name][m][eps == episodes[i].id] for m in metrics}
  order = [e.id for e in episodes if e.id in by_ep]
  return {m: np.concatenate([by_ep[e][m] for e in order]) for m in metrics}


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


def run(cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
  """Fit ``cfg.pipeline`` (one pipeline) on ``cfg.dataset`` and score it out of fold; write the results."""
  t0 = time.perf_counter()
  names = list(cfg.pipeline)
  if len(names) != 1:
    raise ValueError(f'experiments.fit fits one pipeline per run, got {names} (use -m pipeline=a,b)')
  checks.check_fit(cfg)
  name = names[0]
  metrics = list(cfg.dataset.get('metrics') or cfg.eval.metrics)
  common.import_ops_modules(cfg)
  pipe = common.hand_set_pipeline(name, cfg.pipeline[name])
  baselines = {b: common.hand_set_pipeline(b) for b in cfg.fit.baselines if b != name}
  cond_spec = fit_conditioned.spec_of(cfg)  # config errors before any data is loaded
  if cond_spec is not None:
    cond_spec.check(pipe, list(cfg.fit.params or cfg.fit.params_by_pipeline[name]))
  adapter_spec = fit_adapter.spec_of(cfg)
  protocol_info = protocol.check(cfg)  # refuses an already-scored confirmation (unless forced)
  options = pipeline.build_options([pipe, *baselines.values()])
  episodes, embeddings, arrays = prepare(cfg, options)
  folds = make_folds(cfg, [e.id for e in episodes])
  if cfg.fit.split == 'parts':  # train on another part / dataset: its episodes join the rows, never a fold
    train_eps, train_emb, train_arr = prepare(cfg, options, dataset=cfg.fit.train)
    splits.assert_disjoint(
      [q.id for e in train_eps for q in e.questions], [q.id for e in episodes for q in e.questions]
    )
    splits.assert_disjoint_content(train_eps, episodes)
    if {e.id for e in train_eps} & {e.id for e in episodes}:
      raise ValueError('fit.train and the scored dataset share episode ids')
    episodes, embeddings, arrays = train_eps + episodes, train_emb + embeddings, train_arr + arrays
  protocol.check_data(protocol_info, cfg, episodes)  # the data read against the pinned fingerprint (unless forced)
  t_load = time.perf_counter() - t0
  checks.check_scored_questions(episodes, f'dataset {cfg.dataset.name}')
  checks.check_folds(episodes, folds)  # every fold scores >= 1 question and trains on >= 1, before any fitting
  for fold in folds:  # content-level: a copied conversation must not train the fold that scores it
    splits.assert_disjoint_content([e for e in episodes if e.id not in fold], [e for e in episodes if e.id in fold])
  scored_ids = {e for f in folds for e in f}
  scored = [i for i, e in enumerate(episodes) if e.id in scored_ids]
  problem, every, fits = fit_folds(cfg, name, pipe, episodes, arrays, folds)
  t_fit = time.perf_counter() - t0 - t_load

  after = score_folds(cfg, name, pipe, episodes, embeddings, arrays, folds, fits, metrics)
  cond = (
    None
    if cond_spec is None
    else fit_conditioned.run_folds(cfg, name, pipe, episodes, arrays, folds, problem, every, cond_spec, metrics)
  )
  adapted = (
    None
    if adapter_spec is None
    else fit_adapter.run_folds(
      cfg, name, pipe, episodes, embeddings, arrays, folds, problem, every, *adapter_spec, metrics
    )
  )
  before = evaluation.evaluate(
    [episodes[i] for i in scored],
    [embeddings[i] for i in scored],
    {name: pipe, **baselines},
    k=int(cfg.eval.k),
    metrics=metrics,
    seed=int(cfg.seed),
    progress=False,
    arrays=[arrays[i] for i in scored],
    episode_metrics=common.dataset_metrics(cfg.dataset),
  )
  wall = time.perf_counter() - t0
  train_qids = {}
  for fold in folds:  # the disjointness the fits asserted, asserted again on what is written
    train_q = [q.id for e in episodes if e.id not in fold for q in e.questions]
    test_q = [q.id for e in episodes if e.id in fold for q in e.questions]
    splits.assert_disjoint(train_q, test_q)
    train_qids[','.join(fold)] = len(train_q)

  seed, nres = int(cfg.seed), int(cfg.eval.n_resamples)
  rows = {f'{name} (hand-set)': before.scores[name], f'{name} (fitted, out of fold)': after}
  rows.update({f'{b} (hand-set)': before.scores[b] for b in baselines})
  summary = {r: {m: _interval(v[m], seed, nres) for m in metrics} for r, v in rows.items()}
  hand_rows = [name, *baselines]
  paired = {
    f'fitted - {r} (hand-set)': v
    for r, v in paired_tests(after, before, hand_rows, metrics, seed=seed, n_resamples=nres).items()
  }
  by_category = category_tests(before, after, hand_rows, metrics, seed=seed, n_resamples=nres)
  fitted = {'pipeline': name, 'folds': {ep: res.values for fold, res in zip(folds, fits) for ep in fold}}
  split = {
    'kind': cfg.fit.split,
    'seed': int(cfg.fit.seed),
    'folds': [
      {
        'scored_episodes': list(f),
        'train_episodes': sorted({e.id for e in episodes} - set(f)),
        'n_train_questions': train_qids[','.join(f)],
        'scored_questions': [q.id for e in episodes if e.id in f for q in e.questions],
      }
      for f in folds
    ],
  }
  gap = gap_table(folds, fits)
  extra_lines, extra_files = [], {}
  if cond is not None:
    cond_summary = {m: _interval(cond['scores'][m], seed, nres) for m in metrics}
    cond_paired = fit_conditioned.compare(
      cond['scores'], after, before, hand_rows, metrics, seed=seed, n_resamples=nres
    )
    summary[f'{name} (conditioned, out of fold)'] = cond_summary
    paired.update(cond_paired)
    extra_lines = fit_conditioned.section(name, cond_spec, cond_summary, cond_paired, cond, metrics)
    extra_files = fit_conditioned.files(cond, folds)
  if adapted is not None:
    ad_summary = {m: _interval(adapted['scores'][m], seed, nres) for m in metrics}
    ad_paired = fit_conditioned.compare(
      adapted['scores'], after, before, hand_rows, metrics, seed=seed, n_resamples=nres, label='adapter'
    )
    summary[f'{name} (adapter, out of fold)'] = ad_summary
    paired.update(ad_paired)
    extra_lines += fit_adapter.section(name, adapter_spec[0], adapter_spec[1], ad_summary, ad_paired, adapted, metrics)
    extra_files.update(fit_adapter.files(adapted, folds))
  timing = {
    'wall_s': wall,
    'load_embed_s': t_load,
    'fit_s': t_fit,
    'fit_per_fold_s': [r.wall_s for r in fits],
    'score_s': wall - t_load - t_fit,
  }
  if cond is not None:
    extra_results = {
      'conditioned': {
        'spec': OmegaConf.to_container(cfg.fit.conditioned),
        'knob_stats': cond['knob_stats'],
        'scalars': {fit.fold_label(f): r.values for f, r in zip(folds, cond['fits'])},
        'fit_per_fold_s': [r.wall_s for r in cond['fits']],
        'per_question': {m: cond['scores'][m].tolist() for m in metrics},
      }
    }
  else:
    extra_results = {}
  if adapted is not None:
    extra_results['adapter'] = {
      'spec': OmegaConf.to_container(cfg.fit.adapter),
      'mean_cos_to_base': adapted['mean_cos_to_base'],
      'scalars': {fit.fold_label(f): r.values for f, r in zip(folds, adapted['fits'])},
      'fit_per_fold_s': [r.wall_s for r in adapted['fits']],
      'per_question': {m: adapted['scores'][m].tolist() for m in metrics},
    }
    if adapted.get('train_gap'):
      extra_results['adapter']['train_gap'] = adapted['train_gap']
  results = {
    'pipeline': name,
    'protocol': protocol_info,
    'params': [p for p, _ in problem.fitted],
    'hand_set': every,
    'n_questions': len(after[metrics[0]]),
    'metrics': metrics,
    'summary': summary,
    'paired': paired,
    'fitted': fitted['folds'],
    'timing': timing,
    'anneal': list(cfg.fit.get('anneal') or (1.0, 1.0)),
    'soft_hard_gap': gap,
    'by_category': by_category,
    'steps': int(cfg.fit.steps),
    'batch_size': int(cfg.fit.batch_size),
    'per_question': {
      'question_ids': before.question_ids,
      'episode_ids': before.episode_ids,
      'fitted': {m: after[m].tolist() for m in metrics},
      'hand_set': {m: before.scores[name][m].tolist() for m in metrics},
      'baselines': {b: {m: before.scores[b][m].tolist() for m in metrics} for b in baselines},
      'categories': [str(c) for c in before.categories],
    },
    **extra_results,
  }
  lines = [
    f'### {cfg.dataset.name}: {name} fitted by gradient ({cfg.fit.split}, {len(folds)} folds, '
    f'{results["n_questions"]} questions scored out of fold), k={cfg.eval.k}',
    '',
    '| pipeline | ' + ' | '.join(f'{m} [95% CI]' for m in metrics) + ' |',
    '|---|' + '---|' * len(metrics),
  ]
  for r, v in summary.items():
    lines.append(
      f'| {r} | ' + ' | '.join(f'{v[m]["mean"]:.4f} [{v[m]["lo"]:.4f}, {v[m]["hi"]:.4f}]' for m in metrics) + ' |'
    )
  lines += [
    '',
    '| paired difference | ' + ' | '.join(f'{m} delta [95% CI], p' for m in metrics) + ' |',
    '|---|' + '---|' * len(metrics),
  ]
  for r, v in paired.items():
    lines.append(
      f'| {r} | '
      + ' | '.join(f'{v[m]["delta"]:+.4f} [{v[m]["lo"]:+.4f}, {v[m]["hi"]:+.4f}], {v[m]["p"]:.3g}' for m in metrics)
      + ' |'
    )
  primary = (protocol_info or {}).get('primary_metric') or metrics[0]
  if len(by_category) > 1:
    lines += [
      '',
      f'By category ({primary}; fitted minus each hand-set row, paired, 95% CI, p):',
      '',
      '| category | n | fitted | ' + ' | '.join(f'- {r}' for r in hand_rows) + ' |',
      '|---|---|---|' + '---|' * len(hand_rows),
    ]
    for c, v in by_category.items():
      cells = [
        f'{t[primary]["delta"]:+.4f} [{t[primary]["lo"]:+.4f}, {t[primary]["hi"]:+.4f}], {t[primary]["p"]:.3g}'
        for t in v['paired'].values()
      ]
      lines.append(f'| {c} | {v["n"]} | {v["fitted"][primary]:.4f} | ' + ' | '.join(cells) + ' |')
  hand = {r: v[primary]['mean'] for r, v in summary.items() if r.endswith('(hand-set)')}
  best = max(hand, key=hand.get)
  results['best_hand_set'] = {'row': best, 'metric': primary, 'value': hand[best]}
  lines += ['', f'Best hand-set row on these questions by {primary}: {best} ({hand[best]:.4f}).']
  lines += [
    '',
    f'Fitted knobs ({", ".join(p for p, _ in problem.fitted)}; hand-set: '
    f'{ {p: every[p] for p, _ in problem.fitted} }):',
    '',
  ]
  for fold, res in zip(folds, fits):
    lines.append(f'- {fit.fold_label(fold)}: ' + ', '.join(f'{p}={v:.4g}' for p, v in res.values.items()))
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
  lines += extra_lines
  lines += [
    '',
    f'Wall time {wall:.1f}s (load+embed {t_load:.1f}s, fit {t_fit:.1f}s, hard scoring '
    f'{timing["score_s"]:.1f}s); {cfg.fit.steps} steps x {cfg.fit.batch_size} questions per fold.',
    '',
  ]
  text = '\n'.join(lines)
  report.write_files(
    out_dir,
    {
      'fitted.json': json.dumps(fitted, indent=1),
      'loss_curve.json': json.dumps({','.join(f): r.losses for f, r in zip(folds, fits)}),
      'split.json': json.dumps(split, indent=1),
      'results.json': json.dumps(results, indent=1),
      'results.md': text,
      'config_resolved.yaml': OmegaConf.to_yaml(cfg, resolve=True),
      **extra_files,
    },
  )
  print(text)
  log.info('wrote %s', out_dir / 'fitted.json')
  if protocol_info:
    protocol.record(
      protocol_info,
      out_dir,
      summary={r: {m: v[m]['mean'] for m in metrics} for r, v in summary.items()},
      paired={r: {m: {k: v[m][k] for k in ('delta', 'lo', 'hi', 'p')} for m in metrics} for r, v in paired.items()},
      n_questions=results['n_questions'],
    )
  return results


@hydra.main(version_base='1.3', config_path='../conf', config_name='fit')
@common.plain_errors  # the project's errors (EngramError) as one line; ENGRAM_FULL_ERROR=1 for the traceback
def main(cfg: DictConfig) -> float:
  results = run(cfg, Path(HydraConfig.get().runtime.output_dir))
  key = next(k for k in results['summary'] if k.endswith('(fitted, out of fold)'))
  return float(results['summary'][key][results['metrics'][0]]['mean'])


if __name__ == '__main__':
  main()
