"""``experiments.fit``'s artifact: one folder per fitted variant (``<run>/artifact/fitted``, ``.../conditioned``,
``.../adapter``; :mod:`engram_jax.fit.artifact`), each with every fold's fit and, with ``fit.final=true``, the
fit on all the training questions; ``variants.json`` lists them (the last is the run's declared fit)."""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from engram_jax.core import batch
from engram_jax.eval import pipeline
from engram_jax.fit import artifact
from experiments.lib import common

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]


def git_commit() -> dict[str, Any]:
  """The checkout's HEAD and whether its tracked files differ from it (None outside a git checkout)."""
  try:
    head = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=ROOT, capture_output=True, text=True, check=True)
    dirty = subprocess.run(['git', 'diff', '--quiet', 'HEAD'], cwd=ROOT, check=False).returncode != 0
  except (FileNotFoundError, subprocess.CalledProcessError):
    return {'commit': None, 'dirty': None}
  return {'commit': head.stdout.strip(), 'dirty': dirty}


def write(
  cfg: DictConfig, root: Path, plan, data, parts: dict[str, Any], protocol_info: dict | None, array_pipes: list[str]
) -> list[Path]:
  """Write every variant's artifact under ``root``; returns their folders."""
  episodes = data.episodes
  all_ids = [e.id for e in episodes]
  info = {
    'dataset': str(cfg.dataset.name),
    'embedder': OmegaConf.to_container(cfg.embedder, resolve=True),
    'protocol': None
    if not protocol_info
    else {k: protocol_info.get(k) for k in ('name', 'sha256', 'config_sha256', 'forced')},
    'git': git_commit(),
    'array_options': array_pipes,  # the pipelines whose options the padded arrays were built with (hard scoring)
    'fit': {'split': str(cfg.fit.split), 'steps': plan.steps, 'batch_size': plan.batch_size, 'seed': plan.seed},
  }
  out = []
  for label, part in parts.items():
    fits, scored, train_q, train_e = {}, {}, {}, {}
    for f, (fold, res) in enumerate(zip(data.folds, part['fits'])):
      key = f'fold_{f:02d}'
      fits[key], scored[key] = res, list(fold)
      train_e[key] = [e for e in all_ids if e not in fold]
      train_q[key] = [q.id for e in episodes if e.id not in fold for q in e.questions]
    if part.get('final') is not None:
      fits['final'], scored['final'], train_e['final'] = part['final'], [], list(all_ids)
      train_q['final'] = [q.id for e in episodes for q in e.questions]
    out.append(
      artifact.save(
        root / label,
        pipe_name=plan.name,
        pipe_node=OmegaConf.to_container(cfg.pipeline[plan.name], resolve=True),
        params=[p for p, _ in plan.problem.fitted],
        k=int(cfg.eval.k),
        components=part['components'],
        fits=fits,
        scored=scored,
        train_questions=train_q,
        train_episodes=train_e,
        info=info,
      )
    )
  (root / 'variants.json').write_text(json.dumps(list(parts)))
  return out


def is_artifact(path: str | Path | None) -> bool:
  """True when ``path`` is an artifact folder or a run folder holding one (not a fitted.json)."""
  if not path or not Path(path).is_dir():
    return False
  try:
    artifact.resolve(path)
  except FileNotFoundError:
    return False
  return True


def apply(cfg: DictConfig, episodes, embeddings, result, *, metrics: list[str]) -> dict[str, Any]:
  """Score the artifact's pipeline in ``result`` with the artifact ``cfg.fitted`` (``+fitted_variant=adapter``
  etc. picks a variant of a run folder; default its declared fit) (every learned part): each episode that a
  fold of the fit scored, with that fold's fit (its out-of-fold scores, reproduced), every other episode with the
  final fit (transfer). Replaces ``result.scores[name]`` and ``result.retrieved[name]``; returns which fit scored
  which episodes."""
  art = artifact.load(artifact.resolve(cfg.fitted, cfg.get('fitted_variant')))
  name = art.pipe.name
  if name not in result.scores:
    raise ValueError(f'the fitted artifact {art.path} is for pipeline {name!r}, which is not selected')
  by_fit: dict[str, list[int]] = {}
  for i, e in enumerate(episodes):
    by_fit.setdefault(art.fit_for(e.id)[0], []).append(i)
  others = (art.manifest.get('array_options') or [name])[1:]  # the run's baselines: same padded arrays as the fit's
  options = pipeline.build_options([art.pipe, *(common.hand_set_pipeline(n) for n in others)])
  by_ep, ids = {}, {}
  for label, sel in by_fit.items():
    eps, embs = [episodes[i] for i in sel], [embeddings[i] for i in sel]
    arrays = [batch.episode_arrays(e, d, q, **options) for e, (d, q) in zip(eps, embs)]
    got_ids: list = []
    got = artifact.score(
      art.pipe, art.problem, art.every, art.fits[label], art.components, eps, embs, arrays, k=int(cfg.eval.k),
      metrics=metrics, seed=int(cfg.seed), episode_metrics=common.dataset_metrics(cfg.dataset), retrieved=got_ids,
    )  # fmt: skip
    lens = np.cumsum([0] + [len(e.questions) for e in eps])
    for j, e in enumerate(eps):
      by_ep[e.id] = {m: got[m][lens[j] : lens[j + 1]] for m in metrics}
      ids[e.id] = got_ids[lens[j] : lens[j + 1]]
  eps_order = list(dict.fromkeys(result.episode_ids))
  result.scores[name] = {m: np.concatenate([by_ep[e][m] for e in eps_order]) for m in metrics}
  result.retrieved[name] = [x for e in eps_order for x in ids[e]]
  used = {label: [episodes[i].id for i in sel] for label, sel in by_fit.items()}
  log.info('fitted %s from %s: %s', name, art.path, {k: len(v) for k, v in used.items()})
  return {
    'artifact': str(art.path),
    'pipeline': name,
    'components': [c.name for c in art.components],
    'episodes_by_fit': used,
  }
