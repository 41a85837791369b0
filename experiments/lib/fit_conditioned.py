"""The conditioned knobs' report in ``experiments.fit`` (``fit.reports.conditioned``): their per-question values on
each fold's scored questions (results.json ``knob_stats``) and the lines that introduce and close their section of
results.md. The fit, the hard scoring and the paired comparisons are the entry point's, the same for every component
(:mod:`engram_jax.fit.components`).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from engram_jax import fit
from engram_jax.fit import conditioned as C

log = logging.getLogger(__name__)


def extras(run: Any, plan, data, part: dict[str, Any], component: C.Conditioning, alone: bool) -> dict[str, Any]:
  """The conditioned knobs' per-question values on each fold's scored questions: mean, sd, min, max."""
  del run, alone
  spec, episodes, arrays = component, data.episodes, data.arrays
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


def header(name: str, component: C.Conditioning, node: dict[str, Any]) -> str:
  """The line that introduces the conditioned fit's section of results.md."""
  del name, node
  spec = component
  return (
    f'Conditioned knobs {list(spec.knobs)} on {list(spec.features)} (hidden {spec.hidden}, rank '
    f'{spec.rank}, module learning rate x{spec.net_lr_scale}):'
  )


def tail(component: C.Conditioning, node: dict[str, Any], part: dict[str, Any], alone: bool) -> list[str]:
  """The conditioned knobs' per-question values per fold, after a variant's rows in results.md."""
  del component, node, alone
  lines = ['', 'Per-question conditioned knob values (per fold: mean, sd, min, max over its scored questions):', '']
  for fold, st in part['knob_stats'].items():
    lines.append(
      f'- {fold}: '
      + '; '.join(f'{p} {s["mean"]:.3g} (sd {s["sd"]:.2g}, {s["min"]:.3g}..{s["max"]:.3g})' for p, s in st.items())
    )
  return lines
