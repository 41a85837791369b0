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
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from engram_jax.core import batch, runfolder
from engram_jax.core.errors import EngramError
from engram_jax.eval import pipeline
from engram_jax.fit import artifact, components
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
    'embedder_dim': int(np.shape(data.embeddings[0][0])[-1]) if data.embeddings else None,
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
        modules=[*(cfg.get('ops_modules') or []), *(cfg.fit.get('component_modules') or [])],
      )
    )
  runfolder.write_file(root / 'variants.json', json.dumps(list(parts)))
  return out


def is_artifact(path: str | Path | None) -> bool:
  """True when ``path`` is an artifact folder or a run folder holding one (not a fitted.json)."""
  if not path or not Path(path).is_dir():
    return False
  try:
    artifact.resolve(path)
  except (FileNotFoundError, ValueError):
    return False
  return True


# how an encoder runs, not what it is: float32 backends give torch's vectors to rounding (docs/performance.md#encoding)
RUNTIME_KEYS = ('batch_size', 'processes', 'device', 'download', 'progress', 'backend', 'export_dir')


def embedder_spec(node: Any) -> dict[str, Any]:
  """What identifies an embedder in its config node (``model_id`` and the encoder's settings but how it runs;
  ``precision: f32``, the default, is left out as artifacts fitted before it existed have none)."""
  node = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})
  encoder = {k: v for k, v in dict(node.get('encoder') or {}).items() if k not in RUNTIME_KEYS}
  if encoder.get('precision') == 'f32':
    del encoder['precision']
  return {'model_id': node.get('model_id'), 'encoder': encoder}


def _flat(node: Any, prefix: str = '') -> dict[str, Any]:
  if isinstance(node, dict):
    out = {}
    for k, v in node.items():
      out.update(_flat(v, f'{prefix}{k}.'))
    return out
  return {prefix.rstrip('.'): node}


def differences(here: Any, there: Any, limit: int = 4) -> list[str]:
  """``path: X here, Y in the artifact`` for each leaf where two config nodes differ (at most ``limit``, then a
  count)."""
  a, b = _flat(here), _flat(there)
  unset = object()
  diffs = []
  for key in sorted(set(a) | set(b)):
    x, y = a.get(key, unset), b.get(key, unset)
    same = x == y or (isinstance(x, (int, float)) and isinstance(y, (int, float)) and float(x) == float(y))
    if not same:
      x, y = ('unset' if v is unset else repr(v) for v in (x, y))
      diffs.append(f'{key}: {x} here, {y} in the artifact')
  return diffs[:limit] + ([f'... ({len(diffs)} in all)'] if len(diffs) > limit else [])


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
  diffs = differences(here, there)
  if diffs:
    why = f'pipeline {name} differs from the pipeline the artifact applies ({"; ".join(diffs)})'
    if not force:
      raise EngramError(
        f"fitted={cfg.fitted}: {why}: the artifact would apply its own and drop this run's; run with the fit's "
        "pipeline settings (refit to change them), or fitted_force=true to apply the artifact's (recorded)"
      )
    forced.append(why)
  if art.manifest.get('embedder') is not None:
    diffs = differences(embedder_spec(cfg.embedder), embedder_spec(art.manifest['embedder']))
    if diffs:
      why = (
        f'the artifact was fitted on embeddings of {art.manifest["embedder"].get("model_id")!r}, this run embeds '
        f'with {cfg.embedder.get("model_id")!r} ({"; ".join(diffs)})'
      )
      if not force:
        raise EngramError(
          f"fitted={cfg.fitted}: {why}: its knobs were fitted to other vectors; run with the fit's embedder, or "
          'fitted_force=true to apply it anyway (recorded)'
        )
      forced.append(why)
  return art, forced


def check_episodes(cfg: DictConfig, art: artifact.Artifact, episodes, where: str) -> None:
  """Every episode of ``where`` with questions has a fit in ``art`` (a fold that scored it, else the final fit):
  before any embedding."""
  scored = {e for entry in art.manifest['fits'] for e in entry['scored_episodes']}
  if 'final' in art.fits:
    return
  new = sorted(e.id for e in episodes if e.questions and e.id not in scored)
  if new:
    shown = ', '.join(new[:5]) + (f', ... ({len(new)} in all)' if len(new) > 5 else '')
    raise EngramError(
      f'fitted={cfg.fitted}: episodes {shown} of {where} are in none of its folds and the artifact has no final '
      'fit (fit with fit.final=true to apply it to other episodes, or evaluate the episodes it was fitted on)'
    )


def check_dimension(cfg: DictConfig, art: artifact.Artifact, embeddings, forced: list[str]) -> None:
  """The run's vectors have the fit's dimension (the manifest's ``embedder_dim``, else an adapter's rows)."""
  if not embeddings:
    return
  dim = int(np.shape(embeddings[0][0])[-1])
  want = art.manifest.get('embedder_dim')
  tied = components.fixed_dimension(art.components)  # components whose parameters are [D, ...] (the adapter)
  if want is None and tied:  # an older manifest: the rows of the first tensor of such a component
    entry = art.manifest['fits'][0]['tensors']
    want = next((s['shape'][0] for k, s in entry.items() if k.startswith(f'{tied[0]}/')), None)
  if want is None or int(want) == dim:
    return
  why = f"the artifact was fitted on {want}-dimensional vectors, this run's are {dim}-dimensional"
  if tied:
    raise EngramError(
      f'fitted={cfg.fitted}: {why}; its {" and ".join(tied)} cannot apply to them (not even with fitted_force)'
    )
  if not cfg.get('fitted_force'):
    raise EngramError(f"fitted={cfg.fitted}: {why}; run with the fit's embedder, or fitted_force=true (recorded)")
  if why not in forced:
    forced.append(why)


def apply(cfg: DictConfig, episodes, embeddings, result, *, metrics: list[str]) -> dict[str, Any]:
  """Score the artifact's pipeline in ``result`` with the artifact ``cfg.fitted`` (``+fitted_variant=adapter``
  etc. picks a variant of a run folder; default its declared fit) (every learned part): each episode that a
  fold of the fit scored, with that fold's fit (its out-of-fold scores, reproduced), every other episode with the
  final fit (transfer). Replaces ``result.scores[name]`` and ``result.retrieved[name]``; returns which fit scored
  which episodes."""
  art, forced = check(cfg)
  name = art.pipe.name
  check_dimension(cfg, art, embeddings, forced)
  for why in forced:
    log.warning('fitted_force=true: applying %s although %s', art.path, why)
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
    **({'forced': forced} if forced else {}),
  }
