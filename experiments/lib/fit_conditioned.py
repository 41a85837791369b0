"""The conditioned-knob part of ``experiments.fit`` (``fit.conditioned`` set): fit the scalar knobs and the
question-conditioned module (:mod:`engram_jax.fit.conditioned`) per fold, score each fold's questions with the hard
pipeline at per-question fusion knobs, and compare them, paired on the same questions, with the scalar fit of the
same run (same knobs, folds and seeds) and with every hand-set row.
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
from engram_jax.fit import conditioned as C
from engram_jax.fit.knobs import inverse
from engram_jax.metrics import stats
from experiments.lib import common

log = logging.getLogger(__name__)


def spec_of(cfg: DictConfig) -> C.Conditioning | None:
  node = cfg.fit.get('conditioned')
  if not node:
    return None
  node = OmegaConf.to_container(node)
  known = {f.name for f in dataclasses.fields(C.Conditioning)}
  unknown = sorted(set(node) - known)
  if unknown:
    raise ValueError(f'fit.conditioned: unknown keys {unknown}; allowed {sorted(known)}')
  optional = {
    f.name: node[f.name]
    for f in dataclasses.fields(C.Conditioning)
    if f.default is not dataclasses.MISSING and f.name in node
  }
  return C.Conditioning(
    knobs=tuple(node['knobs']),
    features=tuple(node['features']),
    hidden=int(node['hidden']),
    rank=int(node['rank']),
    net_lr_scale=float(node['net_lr_scale']),
    **optional,
  )


def run_folds(
  cfg: DictConfig,
  name: str,
  pipe,
  episodes,
  arrays,
  folds,
  problem: fit.Problem,
  every: dict[str, float],
  spec: C.Conditioning,
  metrics: list[str],
) -> dict[str, Any]:
  """Cross-fit the conditioned pipeline (scalar knobs start at their hand-set values, as the scalar fit's);
  returns per-question scores (scored episodes' order), fits and knob statistics."""
  del name
  spec.check(pipe, [p for p, _ in problem.fitted])
  knobs = fit.Knobs(
    raw={p: jnp.asarray(inverse(t, every[p]), jnp.float32) for p, t in problem.fitted}, transforms=problem.fitted
  )
  rows = fit.build_rows(problem, pipe, episodes, arrays, seed=int(cfg.seed))
  inputs = C.build_inputs(spec, episodes, arrays)
  fits = C.crossfit(
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
  knob_stats = {}
  for fold, res in zip(folds, fits):
    sel = [i for i, e in enumerate(episodes) if e.id in fold]
    got = C.score_episodes(
      pipe,
      problem,
      spec,
      res,
      every,
      [episodes[i] for i in sel],
      [arrays[i] for i in sel],
      k=int(cfg.eval.k),
      metrics=metrics,
      seed=int(cfg.seed),
      indices=range(len(sel)),
      episode_metrics=common.dataset_metrics(cfg.dataset),
    )
    lens = np.cumsum([0] + [len(episodes[i].questions) for i in sel])
    for j, i in enumerate(sel):
      by_ep[episodes[i].id] = {m: got[m][lens[j] : lens[j + 1]] for m in metrics}
    feats = np.concatenate([C.episode_inputs(spec, arrays[i], len(episodes[i].questions))[0] for i in sel])
    query = np.concatenate([C.episode_inputs(spec, arrays[i], len(episodes[i].questions))[1] for i in sel])
    per_q = C.per_question_knobs(problem, spec, res, every, feats, query)
    knob_stats[fit.fold_label(fold)] = {
      p: {'mean': float(np.mean(v)), 'sd': float(np.std(v)), 'min': float(np.min(v)), 'max': float(np.max(v))}
      for p, v in per_q.items()
    }
  order = [e.id for e in episodes if e.id in by_ep]
  scores = {m: np.concatenate([by_ep[e][m] for e in order]) for m in metrics}
  return {'scores': scores, 'fits': fits, 'knob_stats': knob_stats}


def compare(
  cond: dict[str, np.ndarray],
  scalar: dict[str, np.ndarray],
  before,
  hand_rows: list[str],
  metrics: list[str],
  *,
  seed: int,
  n_resamples: int,
  label: str = 'conditioned',
) -> dict[str, Any]:
  """``label`` (the conditioned or adapted fit) minus the scalar fit and minus each hand-set row, paired (bootstrap
  CI, sign-flip p)."""
  others = {'scalar fit (out of fold)': scalar, **{f'{r} (hand-set)': before.scores[r] for r in hand_rows}}
  pairs = [(r, m) for r in others for m in metrics]
  res = stats.paired_tests(
    np.stack([cond[m] for _, m in pairs]),
    np.stack([others[r][m] for r, m in pairs]),
    seed=seed,
    n_resamples=n_resamples,
  )
  out: dict[str, dict] = {f'{label} - {r}': {} for r in others}
  for (r, m), t in zip(pairs, res):
    out[f'{label} - {r}'][m] = t.to_dict()
  return out


def section(name: str, spec: C.Conditioning, summary: dict, paired: dict, part: dict, metrics: list[str]) -> list[str]:
  """Markdown lines of the conditioned fit's results."""
  lines = [
    '',
    f'Conditioned knobs {list(spec.knobs)} on {list(spec.features)} (hidden {spec.hidden}, rank '
    f'{spec.rank}, module learning rate x{spec.net_lr_scale}):',
    '',
    '| row | ' + ' | '.join(f'{m} [95% CI]' for m in metrics) + ' |',
    '|---|' + '---|' * len(metrics),
  ]
  v = summary
  lines.append(
    f'| {name} (conditioned, out of fold) | '
    + ' | '.join(f'{v[m]["mean"]:.4f} [{v[m]["lo"]:.4f}, {v[m]["hi"]:.4f}]' for m in metrics)
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
  lines += ['', 'Per-question conditioned knob values (per fold: mean, sd, min, max over its scored questions):', '']
  for fold, st in part['knob_stats'].items():
    lines.append(
      f'- {fold}: '
      + '; '.join(f'{p} {s["mean"]:.3g} (sd {s["sd"]:.2g}, {s["min"]:.3g}..{s["max"]:.3g})' for p, s in st.items())
    )
  return lines


def files(part: dict, folds) -> dict[str, str]:
  return {'loss_curve_conditioned.json': json.dumps({','.join(f): r.losses for f, r in zip(folds, part['fits'])})}
