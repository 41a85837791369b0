"""The query-adapter part of ``experiments.fit`` (``fit.adapter`` set): per fold, fit the scalar knobs and a low-rank
query adapter (:mod:`engram_jax.fit.adapter`) through the soft pipeline, score the fold's questions with the hard
pipeline on the adapted query embeddings, and compare them, paired, with the scalar fit of the same run and with
every hand-set row. The scalar fit keeps its own ``fit.cfsr_grad``; the adapter's fit uses ``adapter.cfsr_grad``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import jax.numpy as jnp
import numpy as np
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from engram_jax import fit
from engram_jax.eval import evaluation, pipeline
from engram_jax.fit import adapter as A
from engram_jax.fit.knobs import inverse
from experiments.lib import common

log = logging.getLogger(__name__)


def spec_of(cfg: DictConfig) -> tuple[A.AdapterSpec, str] | None:
  node = cfg.fit.get('adapter')
  if not node:
    return None
  node = OmegaConf.to_container(node)
  grad = str(node['cfsr_grad'])
  fit.Settings(cfsr_grad=grad)  # validates it
  return A.AdapterSpec(
    rank=int(node['rank']), lr_scale=float(node['lr_scale']), soft_query_legs=bool(node.get('soft_query_legs', False))
  ), grad


def run_folds(
  cfg: DictConfig,
  name: str,
  pipe,
  episodes,
  embeddings,
  arrays,
  folds,
  problem: fit.Problem,
  every: dict[str, float],
  spec: A.AdapterSpec,
  grad: str,
  metrics: list[str],
) -> dict[str, Any]:
  """Cross-fit the adapter; per-question hard scores in the scored episodes' order, fits, adapter norms."""
  problem = dataclasses.replace(problem, settings=dataclasses.replace(problem.settings, cfsr_grad=grad))
  spec.check(problem)
  knobs = fit.Knobs(
    raw={p: jnp.asarray(inverse(t, every[p]), jnp.float32) for p, t in problem.fitted}, transforms=problem.fitted
  )
  rows = fit.build_rows(problem, pipe, episodes, arrays, seed=int(cfg.seed))
  inputs = A.build_inputs(episodes, arrays)
  fits = A.crossfit(
    problem,
    spec,
    knobs,
    every,
    rows,
    inputs,
    row_episodes=[e.id for e in episodes for _ in e.questions],
    question_ids=[q.id for e in episodes for q in e.questions],
    folds=folds,
    optimizer=instantiate(cfg.fit.optimizer),
    steps=int(cfg.fit.steps),
    batch_size=int(cfg.fit.batch_size),
    seed=int(cfg.fit.seed),
    anneal=tuple(cfg.fit.get('anneal') or (1.0, 1.0)),
    log=log.info,
  )
  by_ep: dict[str, dict[str, np.ndarray]] = {}
  moved = {}
  for fold, res in zip(folds, fits):
    sel = [i for i, e in enumerate(episodes) if e.id in fold]
    emb = [(d, A.adapt_queries(res.adapter, q)) for d, q in (embeddings[i] for i in sel)]
    r = evaluation.evaluate(
      [episodes[i] for i in sel],
      emb,
      {name: pipeline.with_values(pipe, res.values)},
      k=int(cfg.eval.k),
      metrics=metrics,
      seed=int(cfg.seed),
      progress=False,
      episode_metrics=common.dataset_metrics(cfg.dataset),
    )
    eps = np.asarray(r.episode_ids)
    for i in sel:
      by_ep[episodes[i].id] = {m: r.scores[name][m][eps == episodes[i].id] for m in metrics}
    base = np.concatenate([q for _, q in (embeddings[i] for i in sel)])
    moved[fit.fold_label(fold)] = float(np.mean(np.sum(np.concatenate([q for _, q in emb]) * base, -1)))
  order = [e.id for e in episodes if e.id in by_ep]
  out = {
    'scores': {m: np.concatenate([by_ep[e][m] for e in order]) for m in metrics},
    'fits': fits,
    'mean_cos_to_base': moved,
  }
  if cfg.fit.adapter.get('train_gap'):
    out['train_gap'] = train_gap(
      cfg, name, pipe, episodes, embeddings, arrays, folds, fits, problem, every, spec, rows, inputs
    )
  return out


def train_gap(
  cfg: DictConfig,
  name: str,
  pipe,
  episodes,
  embeddings,
  arrays,
  folds,
  fits,
  problem: fit.Problem,
  every: dict[str, float],
  spec: A.AdapterSpec,
  rows,
  inputs,
) -> dict[str, dict[str, float]]:
  """Per fold, on its *training* questions: the fit's soft objective at its last temperatures (approx-NDCG@k), the
  hard NDCG@k of the fitted pipeline on the adapted queries, and the hard NDCG@k of the same scalar knobs on the
  base queries. Soft far above hard: the soft twin flatters the adapter; hard with q' far above hard with q while
  the scored questions lose: the adapter over-fits its training questions. (``fit.adapter.train_gap: true``; it
  changes no fit and no scored number.)"""
  k = int(cfg.eval.k)
  row_episodes = np.asarray([e.id for e in episodes for _ in e.questions])
  anneal = tuple(cfg.fit.get('anneal') or (1.0, 1.0))
  max_gold = fit.max_gold_of(rows)
  soft_fn = A.soft_ndcg_fn(problem, spec, max_gold=max_gold)  # one compilation for every fold
  out = {}
  for fold, res in zip(folds, fits):
    train_rows = np.flatnonzero(~np.isin(row_episodes, list(fold)))
    sel = [i for i, e in enumerate(episodes) if e.id not in fold]
    soft = A.soft_ndcg(
      problem, spec, res, every, rows, inputs, train_rows, scale=float(anneal[1]), max_gold=max_gold, fn=soft_fn
    )
    fitted = {name: pipeline.with_values(pipe, res.values)}
    hard = {}
    for label, adapt in (('adapted', True), ('base', False)):
      emb = [(d, A.adapt_queries(res.adapter, q) if adapt else q) for d, q in (embeddings[i] for i in sel)]
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


def section(
  name: str, spec: A.AdapterSpec, grad: str, summary: dict, paired: dict, part: dict, metrics: list[str]
) -> list[str]:
  lines = [
    '',
    f'Query adapter (rank {spec.rank}, learning rate x{spec.lr_scale}, CFS-R gradient {grad}; pools held '
    'from the base embedding in the soft twin, re-pooled by the hard scorer; cosine legs ranked '
    f'{"soft" if spec.soft_query_legs else "hard"} in the soft fusion):',
    '',
    '| row | ' + ' | '.join(f'{m} [95% CI]' for m in metrics) + ' |',
    '|---|' + '---|' * len(metrics),
  ]
  lines.append(
    f'| {name} (adapter, out of fold) | '
    + ' | '.join(f'{summary[m]["mean"]:.4f} [{summary[m]["lo"]:.4f}, {summary[m]["hi"]:.4f}]' for m in metrics)
    + ' |'
  )
  lines += [
    '',
    '| paired difference | ' + ' | '.join(f'{m} delta [95% CI], p' for m in metrics) + ' |',
    '|---|' + '---|' * len(metrics),
  ]
  for r, t in paired.items():
    lines.append(
      f'| {r} | '
      + ' | '.join(f'{t[m]["delta"]:+.4f} [{t[m]["lo"]:+.4f}, {t[m]["hi"]:+.4f}], {t[m]["p"]:.3g}' for m in metrics)
      + ' |'
    )
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


def files(part: dict, folds) -> dict[str, str]:
  return {'loss_curve_adapter.json': json.dumps({','.join(f): r.losses for f, r in zip(folds, part['fits'])})}
