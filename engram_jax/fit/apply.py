r"""The one road from a fit to a score: :func:`apply` (per-question metrics) and :func:`rank` (label-free questions'
top-k), both behind :func:`guard`, both on :func:`fused` (one episode's final scores, compiled).

Every caller that turns a fit into numbers goes through here: ``experiments.evaluate fitted=RUN`` and the fit's own
held-out scoring (:func:`apply`), :func:`engram_jax.fit.retrieve.retrieve` (:func:`rank`) and the component contract
(:func:`fused`, with the parameter types an artifact hands a scorer). The guards, each a one-line
:class:`~engram_jax.core.errors.EngramError` before any scoring:

* the inputs: ``k`` a positive integer, lists where lists are meant (a string is not a list of questions);
* the vectors: made by the embedder the fit was fitted on (its config node, or its encoder's spec hash) and of its
  dimension; ``force=True`` applies a fit to other vectors anyway and returns what differed (recorded by the
  caller), except a dimension its components cannot take (an adapter's ``[D, D]``);
* the external runs: a ``trec_run`` leg's file is pinned by sha256 at fit time (the manifest's ``runs``) and a
  changed or missing file is refused; :func:`rank` refuses such a leg by name (a run file cannot hold the ids of
  questions it has never seen);
* the episodes: each has a fit (the fold that scored it, else the final fit).

The manifest's own integrity (its ``values`` against the tensors they came from) is checked when it is loaded
(:func:`engram_jax.fit.artifact.load`).
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import jax
import numpy as np

from engram_jax.core import ranking
from engram_jax.core.batch import EpisodeArrays, episode_arrays
from engram_jax.core.errors import EngramError
from engram_jax.core.types import Episode
from engram_jax.eval import evaluation
from engram_jax.eval.pipeline import Pipeline, build_options, pipeline_scores, with_values
from engram_jax.fit import components as registry
from engram_jax.fit.problem import Problem
from engram_jax.fit.train import FitResult


class Artifact(Protocol):
  """What the road reads of a fit (:class:`engram_jax.fit.artifact.Artifact` is one; the artifact module imports
  this one, so the road names the shape it reads instead of importing the class)."""

  path: Path
  manifest: dict[str, Any]
  pipe: Pipeline
  problem: Problem
  every: dict[str, float]
  components: tuple[Any, ...]
  fits: dict[str, FitResult]

  def fit_for(self, episode_id: str) -> tuple[str, FitResult]: ...

  def result(self, label: str = 'final') -> FitResult: ...


# how an encoder runs, not what it is: the float32 backends give torch's vectors to rounding and every question
# the same score (docs/performance.md#encoding), so the backend and where its export lives are runtime settings
RUNTIME_KEYS = ('batch_size', 'processes', 'device', 'download', 'progress', 'backend', 'export_dir')


def check_k(k: Any, where: str = 'k') -> int:
  """``k`` as an int: a positive integer (a float with no fraction is taken; ``True``, ``2.7``, ``0``, ``-1`` are not).

  >>> check_k(10), check_k(5.0)
  (10, 5)
  >>> check_k(2.7)
  Traceback (most recent call last):
  ...
  engram_jax.core.errors.EngramError: k must be a positive integer, got 2.7
  """
  ok = isinstance(k, numbers.Integral) or (isinstance(k, float) and k.is_integer())
  if isinstance(k, bool) or not ok or int(k) < 1:
    raise EngramError(f'{where} must be a positive integer, got {k!r}')
  return int(k)


def check_list(value: Any, what: str) -> list:
  """``value`` as a list: a sequence that is not a string (one text where a list is meant would be split into its
  characters).

  >>> check_list(('a', 'b'), 'questions')
  ['a', 'b']
  >>> check_list('Which dog?', 'questions')
  Traceback (most recent call last):
  ...
  engram_jax.core.errors.EngramError: questions: expected a list, got one str ('Which dog?'); wrap it: ['Which dog?']
  """
  if isinstance(value, (str, bytes)):
    short = value if len(value) <= 40 else value[:37] + '...'
    raise EngramError(f'{what}: expected a list, got one {type(value).__name__} ({short!r}); wrap it: [{short!r}]')
  if not isinstance(value, Sequence):
    raise EngramError(f'{what}: expected a list, got {type(value).__name__}')
  return list(value)


def embedder_spec(node: Mapping[str, Any] | None) -> dict[str, Any]:
  """What identifies an embedder in its config node: ``model_id`` and the encoder's settings but how it runs
  (``precision: f32``, the default, is left out: artifacts fitted before it existed have none; ``bf16`` stays).

  >>> embedder_spec({'model_id': 'm', 'encoder': {'_target_': 'f', 'batch_size': 64, 'dim': 8, 'precision': 'f32'}})
  {'model_id': 'm', 'encoder': {'_target_': 'f', 'dim': 8}}
  """
  node = dict(node or {})
  encoder = {k: v for k, v in dict(node.get('encoder') or {}).items() if k not in RUNTIME_KEYS}
  if encoder.get('precision') == 'f32':
    del encoder['precision']
  return {'model_id': node.get('model_id'), 'encoder': encoder}


def _flat(node: Any, prefix: str = '') -> dict[str, Any]:
  if isinstance(node, Mapping):
    out = {}
    for k, v in node.items():
      out.update(_flat(v, f'{prefix}{k}.'))
    return out
  return {prefix.rstrip('.'): node}


def differences(here: Any, there: Any, limit: int = 4) -> list[str]:
  """``path: X here, Y in the artifact`` for each leaf where two config nodes differ (at most ``limit``, then a
  count).

  >>> differences({'a': 1, 'b': {'c': 2}}, {'a': 1.0, 'b': {'c': 3}})
  ['b.c: 2 here, 3 in the artifact']
  """
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


@dataclasses.dataclass(frozen=True)
class Vectors:
  """What the caller says of the vectors a fit is applied to: the embedder's config node (``node``, as a run's
  ``cfg.embedder``) or its encoder's spec hash (``spec_sha256``, :func:`engram_jax.data.embed.spec_hash` of the
  encoder's ``.spec``), and their dimension. Neither: nothing vouches for them (refused without ``force``)."""

  dim: int | None
  node: Mapping[str, Any] | None = None
  spec_sha256: str | None = None


def vectors_of(embedder: Any, dim: int | None) -> Vectors:
  """:class:`Vectors` from what the caller has: an embedder config node (a mapping with ``model_id``), an encoder
  with a ``.spec`` (its :func:`~engram_jax.data.embed.spec_hash`), or None (nothing vouches).

  >>> from engram_jax.data import hashing_encoder
  >>> len(vectors_of(hashing_encoder(dim=8), 8).spec_sha256)
  64
  """
  if embedder is None:
    return Vectors(dim)
  if isinstance(embedder, Mapping):
    return Vectors(dim, node=dict(embedder))
  spec = getattr(embedder, 'spec', None)
  if not isinstance(spec, Mapping):
    return Vectors(dim)
  return Vectors(dim, spec_sha256=identity_sha256(spec))


def identity_sha256(spec: Mapping[str, Any]) -> str:
  """The hash of what an encoder's vectors are (:func:`engram_jax.data.embed.spec_hash` of its ``.spec``) with a
  float32 backend's entry left out: those give torch's vectors to rounding, so a fit on one applies to the others
  (the embedding cache keeps them apart all the same); a bf16 backend's entry stays.

  >>> a = {'model': 'm', 'dim': 8}
  >>> identity_sha256({**a, 'backend': {'name': 'openvino', 'precision': 'f32'}}) == identity_sha256(a)
  True
  >>> identity_sha256({**a, 'backend': {'name': 'openvino', 'precision': 'bf16'}}) == identity_sha256(a)
  False
  """
  from engram_jax.data.embed import spec_hash  # the cache's key of an encoder's identity

  spec = dict(spec)
  if (spec.get('backend') or {}).get('precision') == 'f32':
    del spec['backend']
  return spec_hash(spec)


def check_vectors(
  art: Artifact, vectors: Vectors, *, force: bool = False, where: str | None = None, force_hint: str = 'force=True'
) -> list[str]:
  """The vectors are the fit's: its embedder and its dimension. Returns what ``force`` let through (empty when
  nothing differs). ``where``: the refusal's prefix (default the artifact's path); ``force_hint``: how the caller
  forces (``fitted_force=true`` for a run).

  Raises:
    EngramError: one line for the first mismatch (without ``force``), or a dimension the artifact's components cannot
      take (an adapter's ``[D, D]``: not even with ``force``).
  """
  forced = []
  recorded = art.manifest.get('embedder')
  model = (recorded or {}).get('model_id')
  why = None
  if vectors.node is not None and recorded is not None:
    diffs = differences(embedder_spec(vectors.node), embedder_spec(recorded))
    if diffs:
      why = (
        f'the artifact was fitted on embeddings of {model!r}, these vectors are of '
        f'{dict(vectors.node).get("model_id")!r} ({"; ".join(diffs)})'
      )
  elif vectors.node is None and recorded is not None:
    want = art.manifest.get('embedder_spec_sha256')
    if vectors.spec_sha256 is None:
      why = f'nothing says which embedder made these vectors (the artifact was fitted on {model!r}; pass the embedder)'
    elif want is not None and vectors.spec_sha256 != want:
      why = f'the artifact was fitted on embeddings of {model!r}, these vectors come from an encoder of another spec'
  where = str(art.path) if where is None else where
  if why is not None:
    if not force:
      raise EngramError(
        f"{where}: {why}: its knobs were fitted to other vectors; use the fit's embedder, or {force_hint} to apply "
        'it anyway (recorded)'
      )
    forced.append(why)
  if vectors.dim is None:
    return forced
  want_dim = art.manifest.get('embedder_dim')
  tied = registry.fixed_dimension(art.components)  # components whose parameters are [D, ...] (the adapter)
  if want_dim is None and tied:  # an older manifest: the rows of the first tensor of such a component
    entry = art.manifest['fits'][0]['tensors']
    want_dim = next((s['shape'][0] for k, s in entry.items() if k.startswith(f'{tied[0]}/')), None)
  if want_dim is None or int(want_dim) == int(vectors.dim):
    return forced
  why = f'the artifact was fitted on {want_dim}-dimensional vectors, these are {vectors.dim}-dimensional'
  if tied:
    raise EngramError(f'{where}: {why}; its {" and ".join(tied)} cannot apply to them (not even with {force_hint})')
  if not force:
    raise EngramError(f"{where}: {why}; use the fit's embedder, or {force_hint} (recorded)")
  return [*forced, why]


def run_legs(art: Artifact) -> dict[str, str]:
  """``{leg name: run file path}`` of the artifact pipeline's ``trec_run`` legs."""
  return pipe_runs(art.pipe)


def pipe_runs(pipe: Pipeline) -> dict[str, str]:
  """``{leg name: absolute path}`` of a pipeline's ``trec_run`` legs (what a fit pins)."""
  return {leg.name: os.path.abspath(str(leg.option('path'))) for leg in pipe.legs if leg.op == 'trec_run'}


def check_runs(art: Artifact, prefix: str | None = None) -> None:
  """Each ``trec_run`` leg's file is the one the fit saw (its sha256 pinned in the manifest's ``runs``).

  Raises:
    EngramError: a run file changed, unreadable, or not pinned (an artifact written before runs were pinned).
  """
  from engram_jax.ops.trec_run import file_sha256

  pinned = art.manifest.get('runs') or {}
  prefix = str(art.path) if prefix is None else prefix
  for name, path in run_legs(art).items():
    want = pinned.get(path)
    if want is None:
      raise EngramError(
        f'{prefix}: leg {name!r} reads the run file {path}, whose content the artifact does not pin (fitted '
        'before runs were pinned); refit to apply it'
      )
    got = file_sha256(path)
    if got != want:
      raise EngramError(
        f'{prefix}: leg {name!r} reads the run file {path}, which changed since the fit (sha256 {want[:12]}... '
        f'then, {got[:12]}... now): the fit weighed another run; restore the file or refit'
      )


def check_episodes(art: Artifact, episodes: Sequence[Episode], where: str, prefix: str | None = None) -> None:
  """Every episode with questions has a fit in ``art`` (a fold that scored it, else the final fit)."""
  if 'final' in art.fits:
    return
  scored = {e for entry in art.manifest['fits'] for e in entry['scored_episodes']}
  new = sorted(e.id for e in episodes if e.questions and e.id not in scored)
  if new:
    shown = ', '.join(new[:5]) + (f', ... ({len(new)} in all)' if len(new) > 5 else '')
    raise EngramError(
      f'{str(art.path) if prefix is None else prefix}: episodes {shown} of {where} are in none of its folds and the artifact has no final fit (fit '
      'with fit.final=true to apply it to other episodes, or evaluate the episodes it was fitted on)'
    )


def check_embeddings(episodes: Sequence[Episode], embeddings: Sequence[tuple[Any, Any]]) -> None:
  """One ``(docs [N, D], queries [Q, D])`` pair per episode, of its sizes and one dimension."""
  if len(embeddings) != len(episodes):
    raise EngramError(f'{len(episodes)} episodes but {len(embeddings)} embedding pairs')
  dims = set()
  for e, (d, q) in zip(episodes, embeddings):
    d, q = np.shape(d), np.shape(q)
    if len(d) != 2 or len(q) != 2 or d[0] != e.n_items or q[0] != len(e.questions) or d[1] != q[1]:
      raise EngramError(
        f'episode {e.id}: expected [{e.n_items}, D] item and [{len(e.questions)}, D] question vectors, got '
        f'{list(d)} and {list(q)}'
      )
    dims.add(d[1])
  if len(dims) > 1:
    raise EngramError(f"the episodes' vectors have {len(dims)} dimensions ({sorted(dims)}): one embedder per run")


def guard(
  art: Artifact,
  episodes: Sequence[Episode],
  embeddings: Sequence[tuple[Any, Any]],
  *,
  k: Any,
  vectors: Vectors | None,
  force: bool,
  where: str,
  fit: str | None = None,
  prefix: str | None = None,
  force_hint: str = 'force=True',
) -> tuple[int, list[str]]:
  """Every guard of the road (the module's list), in order; returns ``k`` checked and what ``force`` let through.
  ``prefix``: the refusals' first words (default the artifact's path); ``force_hint``: how the caller forces."""
  k = check_k(k)
  check_list(episodes, 'episodes')
  check_embeddings(episodes, embeddings)
  if fit is None:
    check_episodes(art, episodes, where, prefix)
  else:
    art.result(fit)
  forced = [] if vectors is None else check_vectors(art, vectors, force=force, where=prefix, force_hint=force_hint)
  check_runs(art, prefix)
  return k, forced


@dataclasses.dataclass
class Applied:
  """What :func:`apply` scored: ``scores`` ``{metric: [Q]}`` (the episodes' order), ``retrieved`` each question's
  top-k item ids (empty where the scorer gives none), which fit scored which episodes, what ``force`` let through."""

  scores: dict[str, np.ndarray]
  retrieved: list
  episodes_by_fit: dict[str, list[str]]
  forced: list[str]


def apply(
  art: Artifact,
  episodes: Sequence[Episode],
  embeddings: Sequence[tuple[np.ndarray, np.ndarray]],
  *,
  k: Any,
  metrics: Sequence[str],
  seed: int,
  vectors: Vectors | None = None,
  force: bool = False,
  fit: str | None = None,
  episode_metrics: Mapping[str, Callable] | None = None,
  array_options: Sequence[Any] = (),
  arrays: Sequence[EpisodeArrays] | None = None,
  where: str = 'the episodes',
  prefix: str | None = None,
  force_hint: str = 'force=True',
) -> Applied:
  """Per-question hard scores of the artifact's fits (every learned part): each episode with the fold that scored it
  out of fold, else the final fit (``fit``: one fit for all), after :func:`guard`.

  Args:
    art: a loaded artifact (or :func:`engram_jax.fit.artifact.in_memory`: a fit's folds before they are saved).
    episodes, embeddings: ``[E]`` episodes and their ``(docs [N, D], queries [Q, D])``.
    k, metrics, seed: as :func:`engram_jax.eval.evaluation.evaluate`.
    vectors: what made the vectors (:class:`Vectors`); None: not checked (the fit's own vectors).
    force: apply despite an embedder or dimension mismatch (returned in ``forced``).
    where, prefix, force_hint: the refusals' words (:func:`guard`).
    arrays: the episodes' padded arrays when already built (with the options of the pipeline and
      ``array_options``); else built here.
    array_options: more pipelines whose options the padded arrays are built with (a run's baselines: the same
      arrays the fit scored with).

  Raises:
    EngramError: a guard's one line.
  """
  k, forced = guard(
    art, episodes, embeddings, k=k, vectors=vectors, force=force, where=where, fit=fit, prefix=prefix,
    force_hint=force_hint,
  )  # fmt: skip
  by_fit: dict[str, list[int]] = {}
  for i, e in enumerate(episodes):
    label = fit if fit is not None else art.fit_for(e.id)[0]
    by_fit.setdefault(label, []).append(i)
  options = build_options([art.pipe, *array_options])
  per_ep: dict[int, tuple[dict[str, np.ndarray], list]] = {}
  for label, sel in by_fit.items():
    eps, embs = [episodes[i] for i in sel], [embeddings[i] for i in sel]
    if arrays is None:
      arr = [episode_arrays(e, d, q, **options) for e, (d, q) in zip(eps, embs)]
    else:
      arr = [arrays[i] for i in sel]
    ids: list = []
    got = score(
      art.pipe, art.problem, art.every, art.result(label), art.components, eps, embs, arr, k=k,
      metrics=metrics, seed=seed, episode_metrics=episode_metrics, retrieved=ids,
    )  # fmt: skip
    lens = np.cumsum([0] + [len(e.questions) for e in eps])
    for j, i in enumerate(sel):
      per_ep[i] = ({m: got[m][lens[j] : lens[j + 1]] for m in metrics}, ids[lens[j] : lens[j + 1]])
  order = range(len(episodes))
  scores = {m: np.concatenate([per_ep[i][0][m] for i in order]) if order else np.zeros(0) for m in metrics}
  retrieved = [x for i in order for x in per_ep[i][1]]
  used = {label: [episodes[i].id for i in sel] for label, sel in by_fit.items()}
  return Applied(scores=scores, retrieved=retrieved, episodes_by_fit=used, forced=forced)


def score(
  pipe: Pipeline,
  problem: Problem,
  every: Mapping[str, float],
  res: FitResult,
  components: Sequence[Any],
  episodes: Sequence[Episode],
  embeddings: Sequence[tuple[np.ndarray, np.ndarray]],
  arrays: Sequence[EpisodeArrays] | None,
  *,
  k: int,
  metrics: Sequence[str],
  seed: int,
  episode_metrics: Mapping[str, Callable] | None = None,
  retrieved: list | None = None,
) -> dict[str, np.ndarray]:
  """Per-question hard scores ``{metric: [Q]}`` (``episodes``' order; ``retrieved``, a list, receives each
  question's top-k item ids) of the fitted pipeline with every learned
  part of ``res``: the knob values; the adapter (queries adapted, pools re-formed under them); the conditioned
  knobs (per-question fusion, :func:`engram_jax.fit.components.score_episodes`; with an adapter too, the module
  reads the base queries' features, as in the fit). ``arrays``: the episodes' padded
  arrays when no adapter changes the queries (else rebuilt)."""
  fitted = with_values(pipe, res.values)
  moved = [(d, registry.hard_queries(components, res.learned, q)) for d, q in embeddings]
  changed = any(m[1] is not e[1] for m, e in zip(moved, embeddings))
  if not registry.per_question(components):
    r = evaluation.evaluate(
      episodes,
      moved,
      {pipe.name: fitted},
      k=k,
      metrics=list(metrics),
      seed=seed,
      progress=False,
      arrays=None if changed else arrays,
      episode_metrics=episode_metrics,
    )
    eps = np.asarray(r.episode_ids)
    if retrieved is not None:
      ids = r.retrieved[pipe.name]
      retrieved.extend(ids[i] for e in episodes for i in np.flatnonzero(eps == e.id))
    return {m: np.concatenate([np.asarray(r.scores[pipe.name][m])[eps == e.id] for e in episodes]) for m in metrics}
  options = build_options([pipe])
  base = arrays or [episode_arrays(e, d, q, **options) for e, (d, q) in zip(episodes, embeddings)]
  legs_see = [episode_arrays(e, d, q, **options) for e, (d, q) in zip(episodes, moved)] if changed else base
  return registry.score_episodes(
    pipe,
    problem,
    components,
    res,
    every,
    episodes,
    legs_see,
    k=k,
    metrics=list(metrics),
    seed=seed,
    indices=range(len(episodes)),
    episode_metrics=episode_metrics,
    feature_arrays=base if changed else None,
    retrieved=retrieved,
  )


def fused(
  art: Artifact, res: FitResult, episode: Episode, docs: np.ndarray, queries: np.ndarray, key: jax.Array
) -> tuple[jax.Array, EpisodeArrays]:
  """One episode's final scores ``[Q_pad, N_pad]`` under fit ``res`` and the arrays its legs saw: each component's
  hard half in order (the adapter moves the queries and the pools are formed again under them; the conditioned
  knobs set per-question values), compiled, the parameters as ``res`` holds them (NumPy when loaded).

  Raises:
    EngramError: the components cannot take these vectors.
  """
  options = build_options([art.pipe])
  base = episode_arrays(episode, docs, queries, **options)
  try:
    moved = registry.hard_queries(art.components, res.learned, queries)
  except (TypeError, ValueError) as e:
    raise EngramError(f'{art.path}: its components cannot take these {docs.shape[1]}-d vectors ({e})') from None
  arrays = base if moved is queries else episode_arrays(episode, docs, moved, **options)
  if registry.per_question(art.components):
    inputs = registry.hard_inputs(art.components, base, len(episode.questions))
    run = jax.jit(
      lambda a, i, k_: registry.hard_scores(art.pipe, art.problem, art.components, res, art.every, a, i, k_)
    )
    return run(arrays, inputs, key), arrays
  fitted = with_values(art.pipe, res.values)
  return jax.jit(lambda a, k_: pipeline_scores(fitted, a, k_))(arrays, key), arrays


def rank(
  art: Artifact,
  episode: Episode,
  docs: np.ndarray,
  queries: np.ndarray,
  *,
  k: Any,
  seed: int = 0,
  fit: str = 'final',
  vectors: Vectors | None = None,
  force: bool = False,
) -> tuple[np.ndarray, np.ndarray, list[str]]:
  """Each question's top-``k`` item indices ``[Q, k']`` and final scores ``[Q, k']`` (``k' = min(k, N)``) under
  fit ``fit``, after :func:`guard` (and a ``trec_run`` leg refused: it cannot hold these questions' ids); returns
  them with what ``force`` let through. Episode ``episode`` gets the key ``fold_in(key(seed), 0)``, as episode 0 of
  :func:`engram_jax.eval.evaluation.evaluate`.

  Raises:
    EngramError: a guard's one line.
  """
  legs = run_legs(art)
  if legs:
    name, path = next(iter(legs.items()))
    raise EngramError(
      f'{art.path}: leg {name!r} reads the external run {path}, which ranks its own questions only; retrieve cannot '
      "serve new questions with it (score the run's questions with experiments.evaluate fitted=)"
    )
  k, forced = guard(art, [episode], [(docs, queries)], k=k, vectors=vectors, force=force, where='retrieve', fit=fit)
  res = art.result(fit)
  scores, arrays = fused(art, res, episode, docs, queries, jax.random.fold_in(jax.random.key(seed), 0))
  idx, vals = ranking.top_k(scores, k=min(k, episode.n_items), where=arrays.where)
  nq = len(episode.questions)
  return np.asarray(idx)[:nq], np.asarray(vals, np.float32)[:nq], forced
