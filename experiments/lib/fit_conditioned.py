"""The conditioned-knob part of ``experiments.fit`` (``fit.conditioned`` set): fit the scalar knobs and the
question-conditioned module (:mod:`engram_jax.fit.conditioned`) per fold, score each fold's questions with the hard
pipeline at per-question fusion knobs, and compare them, paired on the same questions, with the scalar fit of the
same run (same knobs, folds and seeds) and with every hand-set row.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from omegaconf import DictConfig

from engram_jax import fit
from engram_jax.fit import conditioned as C
from engram_jax.metrics import stats
from experiments.lib import common

log = logging.getLogger(__name__)


def extras(cfg: DictConfig, plan, data, part: dict[str, Any]) -> dict[str, Any]:
  """The conditioned knobs' per-question values on each fold's scored questions: mean, sd, min, max."""
  del cfg
  spec, episodes, arrays = plan.conditioned, data.episodes, data.arrays
  knob_stats = {}
  for fold, res in zip(data.folds, part['fits']):
    sel = [i for i, e in enumerate(episodes) if e.id in fold]
    got = [C.episode_inputs(spec, arrays[i], len(episodes[i].questions)) for i in sel]
    feats, query = np.concatenate([f for f, _ in got]), np.concatenate([q for _, q in got])
    per_q = C.per_question_knobs(part['problem'], spec, res, plan.every, feats, query)
    knob_stats[fit.fold_label(fold)] = {
      p: {'mean': float(np.mean(v)), 'sd': float(np.std(v)), 'min': float(np.min(v)), 'max': float(np.max(v))}
      for p, v in per_q.items()
    }
  return {'knob_stats': knob_stats}


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
  others: dict[str, dict[str, np.ndarray]] | None = None,
) -> dict[str, Any]:
  """``label`` (the conditioned, adapted or combined fit) minus the scalar fit, minus each of ``others`` (more rows
  by name, e.g. the adapter fit of the same run) and minus each hand-set row, paired (bootstrap CI, sign-flip p)."""
  others = {
    'scalar fit (out of fold)': scalar,
    **(others or {}),
    **{f'{r} (hand-set)': before.scores[r] for r in hand_rows},
  }
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


def section(name: str, spec: C.Conditioning, results: dict, metrics: list[str]) -> list[str]:
  """Markdown lines of the conditioned fit's results."""
  summary = results['summary'][f'{name} (conditioned, out of fold)']
  paired = {r: t for r, t in results['paired'].items() if r.startswith('conditioned - ')}
  part = results['conditioned']
  lines = [
    '',
    f'Conditioned knobs {list(spec.knobs)} on {list(spec.features)} (hidden {spec.hidden}, rank '
    f'{spec.rank}, module learning rate x{spec.net_lr_scale}):',
    '',
    '| row | ' + ' | '.join(f'{m} [95% CI]' for m in metrics) + ' |',
    '|---|' + '---|' * len(metrics),
  ]
  lines.append(common.md_mean_row(f'{name} (conditioned, out of fold)', summary, metrics))
  lines += [
    '',
    '| paired difference | ' + ' | '.join(f'{m} delta [95% CI], p' for m in metrics) + ' |',
    '|---|' + '---|' * len(metrics),
  ]
  for r, t in paired.items():
    lines.append(common.md_paired_row(r, t, metrics))
  lines += ['', 'Per-question conditioned knob values (per fold: mean, sd, min, max over its scored questions):', '']
  for fold, st in part['knob_stats'].items():
    lines.append(
      f'- {fold}: '
      + '; '.join(f'{p} {s["mean"]:.3g} (sd {s["sd"]:.2g}, {s["min"]:.3g}..{s["max"]:.3g})' for p, s in st.items())
    )
  return lines
