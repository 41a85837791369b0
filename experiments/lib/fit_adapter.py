"""The query adapter's report in ``experiments.fit`` (``fit.reports.adapter``): per fold, the adapted queries' mean
cosine to the base ones, the optional training-question gap (``fit.adapter.train_gap``), and the lines that introduce
and close its section of results.md. The fit, the hard scoring (on the adapted query embeddings) and the paired
comparisons are the entry point's, the same for every component; a fit with the adapter runs on its own
``fit.adapter.cfsr_grad`` (the adapter's ``settings``).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from engram_jax import fit
from engram_jax.eval import evaluation, pipeline
from engram_jax.fit import adapter as A
from experiments.lib import common

log = logging.getLogger(__name__)


def extras(run: Any, plan, data, part: dict[str, Any], component: A.Adapter, alone: bool) -> dict[str, Any]:
  """Per fold, the mean cosine of the adapted to the base query on its scored questions; fit alone (``alone``) with
  ``fit.adapter.train_gap``, the soft-vs-hard gap on its training questions (:func:`train_gap`; the adapter fit's).
  ``run``: the fit's typed settings (:class:`experiments.lib.fit_setup.FitRun`)."""
  episodes, embeddings = data.episodes, data.embeddings
  moved = {}
  for fold, res in zip(data.folds, part['fits']):
    base = np.concatenate([embeddings[i][1] for i, e in enumerate(episodes) if e.id in fold])
    adapted = A.adapt_queries(res.learned[component.name], base)
    moved[fit.fold_label(fold)] = float(np.mean(np.sum(adapted * base, -1)))
  out = {'mean_cos_to_base': moved}
  if alone and plan.nodes[component.name].get('train_gap'):
    out['train_gap'] = train_gap(run, plan, data, part)
  return out


def train_gap(run: Any, plan, data, part: dict[str, Any]) -> dict[str, dict[str, float]]:
  """Per fold, on its *training* questions: the fit's soft objective at its last temperatures (approx-NDCG@k), the
  hard NDCG@k of the fitted pipeline on the adapted queries, and the hard NDCG@k of the same scalar knobs on the
  base queries. Soft far above hard: the soft twin flatters the adapter; hard with q' far above hard with q while
  the scored questions lose: the adapter over-fits its training questions. (``fit.adapter.train_gap: true``; it
  changes no fit and no scored number.)"""
  k, name, pipe = run.k, plan.name, common.hand_set_pipeline(plan.name, run.pipeline_node)
  episodes, embeddings, folds = data.episodes, data.embeddings, data.folds
  problem, components = part['problem'], part['components']
  rows = fit.build_rows(problem, pipe, episodes, data.arrays, seed=run.seed)
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
      emb = [
        (d, A.adapt_queries(res.learned[A.Adapter.name], q) if adapt else q) for d, q in (embeddings[i] for i in sel)
      ]
      r = evaluation.evaluate(
        [episodes[i] for i in sel], emb, fitted, k=k, metrics=[f'ndcg@{k}'], seed=run.seed, progress=False
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


def header(name: str, component: A.Adapter, node: dict[str, Any]) -> str:
  """The line that introduces the adapter fit's section of results.md."""
  del name
  return (
    f'Query adapter (rank {component.rank}, learning rate x{component.lr_scale}, CFS-R gradient {node["cfsr_grad"]}; '
    'pools held from the base embedding in the soft twin, re-pooled by the hard scorer; cosine legs ranked '
    f'{"soft" if component.soft_query_legs else "hard"} in the soft fusion):'
  )


def tail(component: A.Adapter, node: dict[str, Any], part: dict[str, Any], alone: bool) -> list[str]:
  """The adapter's lines after a variant's rows in results.md: the adapted queries' mean cosine to the base ones,
  and (alone, with ``train_gap``) the training questions' soft and hard scores."""
  del component, node, alone
  lines = [
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
