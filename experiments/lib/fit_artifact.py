"""``experiments.fit``'s artifact: one folder per fitted variant (``<run>/artifact/fitted``, ``.../conditioned``,
``.../adapter``; :mod:`engram_jax.fit.artifact`), each with every fold's fit and, with ``fit.final=true``, the
fit on all the training questions; ``variants.json`` lists them (the last is the run's declared fit).

Applying one (``experiments.evaluate fitted=RUN``) checks its provenance first, each mismatch one line
(:class:`~engram_jax.core.errors.EngramError`) before any embedding: the run folder whole
(:func:`engram_jax.core.runfolder.check`), its pipeline selected, the run's pipeline node the artifact's (a leg
override such as ``++pipeline.NAME.legs.cos.depth=50`` would be dropped: the artifact applies its own pipeline), the
run's embedder the fit's (the manifest's ``embedder`` spec), an artifact with a final fit for episodes no fold scored;
after embedding, the vectors' dimension the fit's. ``fitted_force=true`` applies an artifact whose pipeline or
embedder differs anyway (not one of another dimension with an adapter: that cannot run) and records what differed in
``results.json`` (``fitted_artifact.forced``) and the table.
"""

from __future__ import annotations

import json
import logging
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from engram_jax.core import runfolder
from engram_jax.core.errors import EngramError
from engram_jax.eval.config import EvalConfig
from engram_jax.fit import apply as road
from engram_jax.fit import artifact
from experiments.lib import common

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
FORCE = 'fitted_force=true'  # how a run forces an artifact onto other vectors


def git_commit() -> dict[str, Any]:
  """The checkout's HEAD and whether its tracked files differ from it (None outside a git checkout)."""
  try:
    head = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=ROOT, capture_output=True, text=True, check=True)
    dirty = subprocess.run(['git', 'diff', '--quiet', 'HEAD'], cwd=ROOT, check=False).returncode != 0
  except (FileNotFoundError, subprocess.CalledProcessError):
    return {'commit': None, 'dirty': None}
  return {'commit': head.stdout.strip(), 'dirty': dirty}


def write(
  run: Any, root: Path, plan, data, parts: dict[str, Any], protocol_info: dict | None, array_pipes: list[str]
) -> list[Path]:
  """Write every variant's artifact under ``root`` (``run``: the fit's typed settings,
  :class:`experiments.lib.fit_setup.FitRun`); returns their folders."""
  episodes = data.episodes
  all_ids = [e.id for e in episodes]
  info = {
    'dataset': run.dataset,
    'embedder': dict(run.embedder),
    'protocol': None
    if not protocol_info
    else {k: protocol_info.get(k) for k in ('name', 'sha256', 'config_sha256', 'forced')},
    'git': git_commit(),
    'embedder_dim': int(np.shape(data.embeddings[0][0])[-1]) if data.embeddings else None,
    'embedder_spec_sha256': encoder_spec_sha256(run.embedder),
    'array_options': array_pipes,  # the pipelines whose options the padded arrays were built with (hard scoring)
    'fit': {'split': run.config.split, 'steps': plan.steps, 'batch_size': plan.batch_size, 'seed': plan.seed},
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
        pipe_node=dict(run.pipeline_node),
        params=[p for p, _ in plan.problem.fitted],
        k=run.k,
        components=part['components'],
        fits=fits,
        scored=scored,
        train_questions=train_q,
        train_episodes=train_e,
        info=info,
        # the modules this variant needs: a scalar variant never imports another variant's component modules
        modules=[
          *run.ops_modules,
          *(run.config.component_modules if part['components'] else ()),
        ],
      )
    )
  runfolder.write_file(root / 'variants.json', json.dumps(list(parts)))
  return out


def encoder_spec_sha256(node: Mapping[str, Any] | DictConfig) -> str | None:
  """The identity hash of the encoder the embedder node builds (:func:`engram_jax.fit.apply.identity_sha256` of
  its ``.spec``, read without loading a model): what :func:`engram_jax.fit.retrieve.retrieve` checks a given encoder
  against. None when the encoder has no spec."""
  from engram_jax.fit.apply import identity_sha256
  from engram_jax.fit.retrieve import encoder_of

  node = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
  spec = getattr(encoder_of(node), 'spec', None)
  return identity_sha256(spec) if isinstance(spec, dict) else None


def is_artifact(path: str | Path | None) -> bool:
  """True when ``path`` is an artifact folder or a run folder holding one (not a fitted.json)."""
  if not path or not Path(path).is_dir():
    return False
  try:
    artifact.resolve(path)
  except (FileNotFoundError, ValueError):
    return False
  return True


def load(cfg: DictConfig) -> artifact.Artifact:
  """The artifact ``cfg.fitted`` names (``+fitted_variant`` picks a variant of a run folder), loaded and checked
  (:func:`engram_jax.fit.artifact.load`: the run folder whole, every file as the manifest says)."""
  try:
    return artifact.load(str(cfg.fitted), cfg.get('fitted_variant'))
  except FileNotFoundError as e:
    raise EngramError(f'fitted={cfg.fitted}: {e}') from None


def check(cfg: DictConfig) -> tuple[artifact.Artifact, list[str]]:
  """Whether the artifact ``cfg.fitted`` applies to this run, before any data is read: its pipeline is selected, the
  run's node for it is the artifact's, the run's embedder is the fit's. Returns the artifact and what
  ``fitted_force=true`` let through (empty when nothing differs).

  Raises:
    EngramError: one line, for each mismatch (without ``fitted_force``).
  """
  art = load(cfg)
  name = art.pipe.name
  if name not in cfg.pipeline:
    raise EngramError(
      f'fitted={cfg.fitted}: the artifact is for pipeline {name!r}, which is not selected '
      f"(selected: {list(cfg.pipeline)}); add it: 'pipeline=[{name}]'"
    )
  force = bool(cfg.get('fitted_force'))
  keys = ('legs', 'fusion', 'k0')
  here = {k: v for k, v in OmegaConf.to_container(cfg.pipeline[name], resolve=True).items() if k in keys}
  there = {k: v for k, v in dict(art.manifest['pipeline']['node']).items() if k in keys}
  forced = []
  diffs = road.differences(here, there)
  if diffs:
    why = f'pipeline {name} differs from the pipeline the artifact applies ({"; ".join(diffs)})'
    if not force:
      raise EngramError(
        f"fitted={cfg.fitted}: {why}: the artifact would apply its own and drop this run's; run with the fit's "
        "pipeline settings (refit to change them), or fitted_force=true to apply the artifact's (recorded)"
      )
    forced.append(why)
  vectors = road.Vectors(dim=None, node=OmegaConf.to_container(cfg.embedder, resolve=True))
  forced += road.check_vectors(art, vectors, force=force, where=f'fitted={cfg.fitted}', force_hint=FORCE)
  return art, forced


def apply(
  cfg: DictConfig,
  settings: EvalConfig,
  art: artifact.Artifact,
  forced: list[str],
  episodes,
  embeddings,
  result,
  *,
  metrics: list[str],
) -> dict[str, Any]:
  """Score the artifact's pipeline in ``result`` through the library's one road (:func:`engram_jax.fit.apply.apply`,
  every guard: the run's embedder and vectors' dimension the fit's, its external runs unchanged, a fit for every
  episode): each episode that a fold of the fit scored with that fold's fit (its out-of-fold scores, reproduced),
  every other episode with the final fit (transfer). Replaces ``result.scores[name]`` and
  ``result.retrieved[name]``; returns which fit scored which episodes and what ``fitted_force`` let through
  (``settings``: the run's typed ``eval`` node, :class:`engram_jax.eval.config.EvalConfig`)."""
  name = art.pipe.name
  dim = int(np.shape(embeddings[0][0])[-1]) if embeddings else None
  others = (art.manifest.get('array_options') or [name])[1:]  # the run's baselines: same padded arrays as the fit's
  got = road.apply(
    art, episodes, embeddings, k=settings.k, metrics=metrics, seed=int(cfg.seed),
    vectors=road.Vectors(dim=dim, node=OmegaConf.to_container(cfg.embedder, resolve=True)),
    force=bool(cfg.get('fitted_force')), episode_metrics=common.dataset_metrics(cfg.dataset),
    array_options=[common.hand_set_pipeline(n) for n in others], where=f'dataset {cfg.dataset.name}',
    prefix=f'fitted={cfg.fitted}', force_hint=FORCE,
  )  # fmt: skip
  forced = list(dict.fromkeys([*forced, *got.forced]))
  for why in forced:
    log.warning('fitted_force=true: applying %s although %s', art.path, why)
  by_ep = {e.id: i for i, e in enumerate(episodes)}
  lens = np.cumsum([0] + [len(e.questions) for e in episodes])
  eps_order = [by_ep[e] for e in dict.fromkeys(result.episode_ids)]
  result.scores[name] = {m: np.concatenate([got.scores[m][lens[i] : lens[i + 1]] for i in eps_order]) for m in metrics}
  result.retrieved[name] = [x for i in eps_order for x in got.retrieved[lens[i] : lens[i + 1]]]
  log.info('fitted %s from %s: %s', name, art.path, {k: len(v) for k, v in got.episodes_by_fit.items()})
  return {
    'artifact': str(art.path),
    'pipeline': name,
    'components': [c.name for c in art.components],
    'episodes_by_fit': got.episodes_by_fit,
    **({'forced': forced} if forced else {}),
  }
