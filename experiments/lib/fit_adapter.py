"""The query-adapter part of ``experiments.fit`` (``fit.adapter`` set): per fold, fit the scalar knobs and a low-rank
query adapter (:mod:`engram_jax.fit.adapter`) through the soft pipeline, score the fold's questions with the hard
pipeline on the adapted query embeddings, and compare them, paired, with the scalar fit of the same run and with
every hand-set row. The scalar fit keeps its own ``fit.cfsr_grad``; the adapter's fit uses ``adapter.cfsr_grad``.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from omegaconf import DictConfig

from engram_jax import fit
from engram_jax.eval import evaluation, pipeline
from engram_jax.fit import adapter as A
from experiments.lib import common

log = logging.getLogger(__name__)


def extras(cfg: DictConfig, plan, data, part: dict[str, Any], gap: bool = True) -> dict[str, Any]:
  """Per fold, the mean cosine of the adapted to the base query on its scored questions; with ``gap`` and
  ``fit.adapter.train_gap``, the soft-vs-hard gap on its training questions (:func:`train_gap`; the adapter fit's)."""
  episodes, embeddings = data.episodes, data.embeddings
  moved = {}
  for fold, res in zip(data.folds, part['fits']):
    base = np.concatenate([embeddings[i][1] for i, e in enumerate(episodes) if e.id in fold])
    adapted = A.adapt_queries(res.learned['adapter'], base)
    moved[fit.fold_label(fold)] = float(np.mean(np.sum(adapted * base, -1)))
  out = {'mean_cos_to_base': moved}
  if gap and cfg.fit.adapter.get('train_gap'):
    out['train_gap'] = train_gap(cfg, plan, data, part)
  return out


def train_gap(cfg: DictConfig, plan, data, part: dict[str, Any]) -> dict[str, dict[str, float]]:
  """Per fold, on its *training* questions: the fit's soft objective at its last temperatures (approx-NDCG@k), the
  hard NDCG@k of the fitted pipeline on the adapted queries, and the hard NDCG@k of the same scalar knobs on the
  base queries. Soft far above hard: the soft twin flatters the adapter; hard with q' far above hard with q while
  the scored questions lose: the adapter over-fits its training questions. (``fit.adapter.train_gap: true``; it
  changes no fit and no scored number.)"""
  k, name, pipe = int(cfg.eval.k), plan.name, common.hand_set_pipeline(plan.name, cfg.pipeline[plan.name])
  episodes, embeddings, folds = data.episodes, data.embeddings, data.folds
  problem, components = part['problem'], part['components']
  rows = fit.build_rows(problem, pipe, episodes, data.arrays, seed=int(cfg.seed))
  inputs = {c.name: c.inputs(problem, episodes, data.arrays) for c in components}
  row_episodes = np.asarray([e.id for e in episodes for _ in e.questions])
  max_gold = fit.max_gold_of(rows)
  out = {}
  for fold, res in zip(folds, part['fits']):
    train_rows = np.flatnonzero(~np.isin(row_episodes, list(fold)))
    sel = [i for i, e in enumerate(episodes) if e.id not in fold]
    soft = fit.soft_objective(
      problem, res, plan.every, rows, train_rows, scale=float(plan.anneal[1]), max_gold=max_gold,
      components=components, inputs=inputs,
    )  # fmt: skip
    fitted = {name: pipeline.with_values(pipe, res.values)}
    hard = {}
    for label, adapt in (('adapted', True), ('base', False)):
      emb = [(d, A.adapt_queries(res.learned['adapter'], q) if adapt else q) for d, q in (embeddings[i] for i in sel)]
      r = evaluation.evaluate(
        [episodes[i] for i in sel], emb, fitted, k=k, metrics=[f'ndcg@{k}'], seed=int(cfg.seed), progress=False
      )
      hard[label] = float(np.mean(r.scores[name][f'ndcg@{k}']))
    out[fit.fold_label(fold)] = {
      'train_questions': int(len(train_rows)),
      'soft_ndcg': soft,
      'hard_ndcg_adapted': hard['adapted'],
      'hard_ndcg_base_query': hard['base'],
    }
    log.info(
      'adapter train gap, fold %s: soft %.4f, hard %.4f (base query %.4f) on %d training questions',
      fit.fold_label(fold),
      soft,
      hard['adapted'],
      hard['base'],
      len(train_rows),
    )
  return out


def section(name: str, spec: A.Adapter, grad: str, results: dict, metrics: list[str]) -> list[str]:
  """Markdown lines of the adapter fit's results."""
  summary = results['summary'][f'{name} (adapter, out of fold)']
  paired = {r: t for r, t in results['paired'].items() if r.startswith('adapter - ')}
  part = results['adapter']
  lines = [
    '',
    f'Query adapter (rank {spec.rank}, learning rate x{spec.lr_scale}, CFS-R gradient {grad}; pools held '
    'from the base embedding in the soft twin, re-pooled by the hard scorer; cosine legs ranked '
    f'{"soft" if spec.soft_query_legs else "hard"} in the soft fusion):',
    '',
    '| row | ' + ' | '.join(f'{m} [95% CI]' for m in metrics) + ' |',
    '|---|' + '---|' * len(metrics),
  ]
  lines.append(common.md_mean_row(f'{name} (adapter, out of fold)', summary, metrics))
  lines += [
    '',
    '| paired difference | ' + ' | '.join(f'{m} delta [95% CI], p' for m in metrics) + ' |',
    '|---|' + '---|' * len(metrics),
  ]
  for r, t in paired.items():
    lines.append(common.md_paired_row(r, t, metrics))
  lines += [
    '',
    'Mean cosine of adapted to base query, per fold: '
    + ', '.join(f'{f} {v:.4f}' for f, v in part['mean_cos_to_base'].items()),
  ]
  if part.get('train_gap'):
    lines += [
      '',
      'On the training questions (fit.adapter.train_gap): soft approx-NDCG@k at the last temperatures, '
      'hard NDCG@k on the adapted queries and on the base queries (same scalar knobs):',
      '',
      '| fold | training questions | soft | hard, adapted | hard, base query |',
      '|---|---|---|---|---|',
    ]
    lines += [
      f'| {f} | {g["train_questions"]} | {g["soft_ndcg"]:.4f} | {g["hard_ndcg_adapted"]:.4f} | '
      f'{g["hard_ndcg_base_query"]:.4f} |'
      for f, g in part['train_gap'].items()
    ]
  return lines


def combined_section(name: str, results: dict, metrics: list[str]) -> list[str]:
  """Markdown lines of the combined fit (``fit.combined``: adapter and conditioned knobs in one fit)."""
  summary = results['summary'][f'{name} (combined, out of fold)']
  part = results['combined']
  lines = [
    '',
    'Adapter and conditioned knobs in one fit (fit.combined; the specs of fit.adapter and fit.conditioned):',
    '',
    '| row | ' + ' | '.join(f'{m} [95% CI]' for m in metrics) + ' |',
    '|---|' + '---|' * len(metrics),
    common.md_mean_row(f'{name} (combined, out of fold)', summary, metrics),
    '',
    '| paired difference | ' + ' | '.join(f'{m} delta [95% CI], p' for m in metrics) + ' |',
    '|---|' + '---|' * len(metrics),
  ]
  for r, t in results['paired'].items():
    if r.startswith('combined - '):
      lines.append(common.md_paired_row(r, t, metrics))
  lines += [
    '',
    'Mean cosine of adapted to base query, per fold: '
    + ', '.join(f'{f} {v:.4f}' for f, v in part['mean_cos_to_base'].items()),
  ]
  return lines
