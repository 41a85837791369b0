"""``experiments.fit``'s artifact: one folder per fitted variant (``<run>/artifact/fitted``, ``.../conditioned``,
``.../adapter``; :mod:`engram_jax.fit.artifact`), each with every fold's fit and, with ``fit.final=true``, the
fit on all the training questions; ``variants.json`` lists them (the last is the run's declared fit)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from engram_jax.fit import artifact

ROOT = Path(__file__).resolve().parents[2]


def git_commit() -> dict[str, Any]:
  """The checkout's HEAD and whether its tracked files differ from it (None outside a git checkout)."""
  try:
    head = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=ROOT, capture_output=True, text=True, check=True)
    dirty = subprocess.run(['git', 'diff', '--quiet', 'HEAD'], cwd=ROOT, check=False).returncode != 0
  except (FileNotFoundError, subprocess.CalledProcessError):
    return {'commit': None, 'dirty': None}
  return {'commit': head.stdout.strip(), 'dirty': dirty}


def write(cfg: DictConfig, root: Path, plan, data, parts: dict[str, Any], protocol_info: dict | None) -> list[Path]:
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
